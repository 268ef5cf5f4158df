// Command codewalk measures how a package reads: the walk of one function's
// work through the package's files, and which of its files use which.
//
//	go run ./scripts/codewalk [-dir internal/stock] [-from Service.turn]
//
// The walk is the static call sequence from the function named by -from,
// depth first, in the order the calls are written, into the package's own
// functions and methods only, each visited once. A stay is a run of
// functions in one file; the report gives the stays, the files they are
// in, and the returns: stays in a file the walk had already left.
//
// A file uses another when it names something the other declares. The
// package is type-checked from its own sources alone: what it imports is
// left unresolved, which is enough for the package's own names.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	dir := flag.String("dir", "internal/stock", "the package's directory")
	from := flag.String("from", "Service.turn", "the function the walk starts from: Name, or Type.Method")
	flag.Parse()
	if err := run(*dir, *from); err != nil {
		fmt.Fprintln(os.Stderr, "codewalk:", err)
		os.Exit(1)
	}
}

// pkg is the package as parsed and checked.
type pkg struct {
	fset  *token.FileSet
	files []*ast.File
	info  *types.Info
	decls map[types.Object]*ast.FuncDecl
}

func load(dir string) (*pkg, error) {
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	p := &pkg{fset: fset, decls: map[types.Object]*ast.FuncDecl{}}
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, m, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		p.files = append(p.files, f)
	}
	if len(p.files) == 0 {
		return nil, fmt.Errorf("no Go files in %s", dir)
	}
	p.info = &types.Info{Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil), Error: func(error) {}}
	// Imports outside the standard library do not resolve: their names are
	// left invalid, and the package's own still resolve.
	conf.Importer = stdOnly{conf.Importer}
	checked, _ := conf.Check(p.files[0].Name.Name, fset, p.files, p.info)
	for _, f := range p.files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				if obj := p.info.Defs[fd.Name]; obj != nil && obj.Pkg() == checked {
					p.decls[obj] = fd
				}
			}
		}
	}
	return p, nil
}

// stdOnly imports the standard library and refuses the rest.
type stdOnly struct{ types.Importer }

func (s stdOnly) Import(path string) (*types.Package, error) {
	if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") || first == "shop" {
		return nil, fmt.Errorf("not resolved: %s", path)
	}
	return s.Importer.Import(path)
}

func (p *pkg) file(pos token.Pos) string { return filepath.Base(p.fset.Position(pos).Filename) }

// name is fd's name as -from writes it.
func name(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// callees are the package's functions fd calls, in the order written.
func (p *pkg) callees(fd *ast.FuncDecl) []*ast.FuncDecl {
	var out []*ast.FuncDecl
	if fd.Body == nil {
		return nil
	}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		var id *ast.Ident
		switch fn := ast.Unparen(call.Fun).(type) {
		case *ast.Ident:
			id = fn
		case *ast.SelectorExpr:
			id = fn.Sel
		case *ast.IndexExpr: // a generic function's instantiation
			if i, ok := fn.X.(*ast.Ident); ok {
				id = i
			}
		}
		if id == nil {
			return true
		}
		obj := p.info.Uses[id]
		if f, ok := obj.(*types.Func); ok {
			if d := p.decls[f.Origin()]; d != nil {
				out = append(out, d)
			}
		}
		return true
	})
	return out
}

func run(dir, from string) error {
	p, err := load(dir)
	if err != nil {
		return err
	}
	var start *ast.FuncDecl
	for _, fd := range p.decls {
		if name(fd) == from {
			start = fd
		}
	}
	if start == nil {
		return fmt.Errorf("no function %s in %s", from, dir)
	}

	// The walk.
	seen := map[*ast.FuncDecl]bool{}
	var seq []*ast.FuncDecl
	var walk func(fd *ast.FuncDecl)
	walk = func(fd *ast.FuncDecl) {
		if seen[fd] {
			return
		}
		seen[fd] = true
		seq = append(seq, fd)
		for _, c := range p.callees(fd) {
			walk(c)
		}
	}
	walk(start)
	type stay struct {
		file  string
		funcs []string
	}
	var stays []stay
	for _, fd := range seq {
		f := p.file(fd.Pos())
		if len(stays) == 0 || stays[len(stays)-1].file != f {
			stays = append(stays, stay{file: f})
		}
		stays[len(stays)-1].funcs = append(stays[len(stays)-1].funcs, name(fd))
	}
	entered := map[string]int{}
	returns := 0
	fmt.Printf("walk from %s in %s: %d functions\n", from, dir, len(seq))
	for i, s := range stays {
		mark := ""
		if entered[s.file] > 0 {
			returns++
			mark = " (return)"
		}
		entered[s.file]++
		fmt.Printf("%3d  %-14s%s  %s\n", i+1, s.file, mark, strings.Join(s.funcs, ", "))
	}
	files := sortedKeys(entered)
	fmt.Printf("stays %d, files %d, returns to a file already left %d\n", len(stays), len(entered), returns)
	for _, f := range files {
		fmt.Printf("  entered %-14s %d times\n", f, entered[f])
	}

	// Which file uses which.
	uses := map[string]map[string]bool{}
	declared := map[types.Object]string{}
	for obj, fd := range p.decls {
		declared[obj] = p.file(fd.Pos())
	}
	for id, obj := range p.info.Defs {
		if obj != nil && obj.Parent() != nil && obj.Parent() == obj.Pkg().Scope() {
			declared[obj] = p.file(id.Pos())
		}
	}
	// Methods and fields of the package's types belong to their file too.
	for id, obj := range p.info.Defs {
		if obj == nil {
			continue
		}
		if f, ok := obj.(*types.Func); ok && f.Type().(*types.Signature).Recv() != nil {
			declared[obj] = p.file(id.Pos())
		}
	}
	for id, obj := range p.info.Uses {
		to, ok := declared[obj]
		if !ok {
			continue
		}
		by := p.file(id.Pos())
		if by == to {
			continue
		}
		if uses[by] == nil {
			uses[by] = map[string]bool{}
		}
		uses[by][to] = true
	}
	var all []string
	for _, f := range p.files {
		all = append(all, filepath.Base(p.fset.Position(f.Pos()).Filename))
	}
	sort.Strings(all)
	usedBy := map[string]int{}
	for _, tos := range uses {
		for to := range tos {
			usedBy[to]++
		}
	}
	fmt.Printf("\nfiles of %s (%d): uses → files it uses; used by\n", dir, len(all))
	for _, f := range all {
		fmt.Printf("  %-14s uses %2d, used by %2d  → %s\n", f, len(uses[f]), usedBy[f], strings.Join(sortedKeys(uses[f]), " "))
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
