package validate

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
)

// Metrics are the names of the series shop exports, as a query names
// them: a histogram's _bucket, _sum and _count, every other metric by its
// name.
type Metrics map[string]bool

// optsKinds are client_golang's option types, and what series of each a
// query can name beside the name itself ("" is the name itself).
var optsKinds = map[string][]string{
	"CounterOpts":   {""},
	"GaugeOpts":     {""},
	"Opts":          {""},
	"HistogramOpts": {"_bucket", "_sum", "_count"},
	"SummaryOpts":   {"", "_sum", "_count"},
}

// ReadMetrics reads the metrics shop exports from the non-test Go files
// under dirs (cmd/shop, internal): every prometheus.XxxOpts literal, its
// name joined from Namespace, Subsystem and Name as client_golang joins
// them. A Name that is a parameter of a function literal (the cache's
// counter helper) takes each string literal passed for it where that
// function is called in the same file.
func ReadMetrics(dirs ...string) (Metrics, error) {
	m := Metrics{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			readFileMetrics(f, m)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("validate: %w", err)
		}
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("validate: no metric found in %s", strings.Join(dirs, ", "))
	}
	return m, nil
}

// metricOpts is one prometheus.XxxOpts literal.
type metricOpts struct {
	kind                 string
	namespace, subsystem string
	// name is the Name literal's value, or "" when param is set.
	name string
	// param is the Name when it is an identifier: a helper's parameter.
	param string
}

// fullName is client_golang's BuildFQName.
func (o metricOpts) fullName(name string) string {
	var parts []string
	for _, p := range []string{o.namespace, o.subsystem, name} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "_")
}

// add adds the series of the metric name of kind o.kind to m.
func (o metricOpts) add(m Metrics, name string) {
	for _, suffix := range optsKinds[o.kind] {
		m[o.fullName(name)+suffix] = true
	}
}

// readFileMetrics adds the metrics of one file to m.
func readFileMetrics(f *ast.File, m Metrics) {
	// helpers maps a variable holding a function literal to the options
	// built from one of its parameters, and that parameter's position.
	type helper struct {
		opts  metricOpts
		index int
	}
	helpers := map[string]helper{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			for i, rhs := range n.Rhs {
				lit, ok := rhs.(*ast.FuncLit)
				if !ok || i >= len(n.Lhs) {
					continue
				}
				id, ok := n.Lhs[i].(*ast.Ident)
				if !ok {
					continue
				}
				params := paramNames(lit.Type)
				ast.Inspect(lit.Body, func(n ast.Node) bool {
					if o, ok := readOpts(n); ok && o.param != "" {
						if j := slices.Index(params, o.param); j >= 0 {
							helpers[id.Name] = helper{o, j}
						}
					}
					return true
				})
			}
		default:
			if o, ok := readOpts(n); ok && o.param == "" {
				o.add(m, o.name)
			}
		}
		return true
	})
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		id, ok := call.Fun.(*ast.Ident)
		if !ok {
			return true
		}
		h, ok := helpers[id.Name]
		if !ok || h.index >= len(call.Args) {
			return true
		}
		if name, ok := stringLit(call.Args[h.index]); ok {
			h.opts.add(m, name)
		}
		return true
	})
}

// paramNames returns the names of a function's parameters, in order.
func paramNames(t *ast.FuncType) []string {
	var names []string
	for _, field := range t.Params.List {
		for _, id := range field.Names {
			names = append(names, id.Name)
		}
	}
	return names
}

// readOpts reads n if it is a prometheus.XxxOpts literal whose Name is a
// string literal or an identifier.
func readOpts(n ast.Node) (metricOpts, bool) {
	lit, ok := n.(*ast.CompositeLit)
	if !ok {
		return metricOpts{}, false
	}
	sel, ok := lit.Type.(*ast.SelectorExpr)
	if !ok {
		return metricOpts{}, false
	}
	if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" || optsKinds[sel.Sel.Name] == nil {
		return metricOpts{}, false
	}
	o := metricOpts{kind: sel.Sel.Name}
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key, ok := kv.Key.(*ast.Ident)
		if !ok {
			continue
		}
		v, isLit := stringLit(kv.Value)
		switch key.Name {
		case "Namespace":
			o.namespace = v
		case "Subsystem":
			o.subsystem = v
		case "Name":
			if id, ok := kv.Value.(*ast.Ident); ok {
				o.param = id.Name
			} else if isLit {
				o.name = v
			}
		}
	}
	return o, o.name != "" || o.param != ""
}
