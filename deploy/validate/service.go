// Package validate checks the deployment files against the service they
// deploy: the Kubernetes manifests of deploy/k8s, rendered with kustomize's
// Go API and decoded strictly into the Kubernetes API's types, and
// docker-compose.yml, loaded by the loader docker compose uses, with its
// schema. What the files must agree with is read from the service's own
// source (cmd/shop): the SHOP_* settings it reads, their defaults, the
// drain and the shutdown timeout. Nothing of the service is imported, so
// this module does not weigh on the service's and the service's on it.
package validate

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Service is what the deployment files must agree with, read from the
// service's source.
type Service struct {
	// Env holds every SHOP_* variable the service reads.
	Env map[string]bool
	// Defaults are the settings' defaults that are written as string
	// literals beside their names (SHOP_HTTP_ADDR's ":8080").
	Defaults map[string]string
	// Drain is SHOP_DRAIN's default: how long a stopping replica keeps
	// serving the connections it has (defaultDrain).
	Drain time.Duration
	// Shutdown is how long in-flight requests get once the drain is over
	// (shutdownTimeout).
	Shutdown time.Duration
}

// envName is a SHOP_* variable's name, as a whole string literal.
var envName = regexp.MustCompile(`^SHOP_[A-Z0-9_]+$`)

// ReadService reads the non-test Go files of the service's command
// (cmd/shop): every string literal that is a SHOP_* name is a setting it
// reads, a call whose first two arguments are such a name and a string
// literal gives that setting's default (get, oneOf, between), and the
// constants defaultDrain and shutdownTimeout give the drain and the
// shutdown.
func ReadService(dir string) (Service, error) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return Service{}, err
	}
	s := Service{Env: map[string]bool{}, Defaults: map[string]string{}}
	consts := map[string]ast.Expr{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return Service{}, err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if v, ok := stringLit(n); ok && envName.MatchString(v) {
					s.Env[v] = true
				}
			case *ast.CallExpr:
				if len(n.Args) >= 2 {
					name, ok1 := stringLit(n.Args[0])
					def, ok2 := stringLit(n.Args[1])
					if ok1 && ok2 && envName.MatchString(name) {
						s.Defaults[name] = def
					}
				}
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if i < len(n.Values) {
						consts[id.Name] = n.Values[i]
					}
				}
			}
			return true
		})
	}
	if len(s.Env) == 0 {
		return Service{}, fmt.Errorf("validate: no SHOP_* setting found in %s", dir)
	}
	if s.Drain, err = durationConst(consts, "defaultDrain"); err != nil {
		return Service{}, err
	}
	if s.Shutdown, err = durationConst(consts, "shutdownTimeout"); err != nil {
		return Service{}, err
	}
	return s, nil
}

// stringLit returns the value of e if it is a string literal.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(lit.Value)
	return v, err == nil
}

// timeUnits are the time package's units a duration constant may use.
var timeUnits = map[string]time.Duration{
	"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond, "Millisecond": time.Millisecond,
	"Second": time.Second, "Minute": time.Minute, "Hour": time.Hour,
}

// durationConst evaluates the constant name, written as a product of
// integers, time units and other such constants (5 * time.Second).
func durationConst(consts map[string]ast.Expr, name string) (time.Duration, error) {
	e, ok := consts[name]
	if !ok {
		return 0, fmt.Errorf("validate: no constant %s in the service's source", name)
	}
	d, err := evalDuration(consts, e, 0)
	if err != nil {
		return 0, fmt.Errorf("validate: constant %s: %w", name, err)
	}
	return d, nil
}

func evalDuration(consts map[string]ast.Expr, e ast.Expr, depth int) (time.Duration, error) {
	if depth > 10 {
		return 0, errors.New("constants refer to each other too deeply")
	}
	switch e := e.(type) {
	case *ast.ParenExpr:
		return evalDuration(consts, e.X, depth+1)
	case *ast.BasicLit:
		n, err := strconv.ParseInt(e.Value, 0, 64)
		return time.Duration(n), err
	case *ast.SelectorExpr:
		if pkg, ok := e.X.(*ast.Ident); ok && pkg.Name == "time" {
			if u, ok := timeUnits[e.Sel.Name]; ok {
				return u, nil
			}
		}
	case *ast.Ident:
		if c, ok := consts[e.Name]; ok {
			return evalDuration(consts, c, depth+1)
		}
	case *ast.BinaryExpr:
		if e.Op == token.MUL {
			x, err := evalDuration(consts, e.X, depth+1)
			if err != nil {
				return 0, err
			}
			y, err := evalDuration(consts, e.Y, depth+1)
			return x * y, err
		}
	}
	return 0, fmt.Errorf("%T is not a product of integers and time units", e)
}

// drain returns the drain a process with env has: SHOP_DRAIN, or the
// service's default.
func (s Service) drain(env map[string]string) (time.Duration, error) {
	v, ok := env["SHOP_DRAIN"]
	if !ok || v == "" {
		return s.Drain, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("SHOP_DRAIN=%q: %w", v, err)
	}
	return d, nil
}

// listener returns the address of the listener a process with env has by
// the setting name (SHOP_HTTP_ADDR, SHOP_ADMIN_ADDR), or by its default,
// and its host and port.
func (s Service) listener(env map[string]string, name string) (addr, host string, port int, err error) {
	addr, ok := env[name]
	if !ok || addr == "" {
		addr = s.Defaults[name]
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, "", 0, fmt.Errorf("%s=%q: %w", name, addr, err)
	}
	if port, err = strconv.Atoi(p); err != nil {
		return addr, "", 0, fmt.Errorf("%s=%q: port: %w", name, addr, err)
	}
	return addr, host, port, nil
}

// listenPort returns the port a process with env listens on: SHOP_HTTP_ADDR's,
// or its default's.
func (s Service) listenPort(env map[string]string) (int, error) {
	_, _, port, err := s.listener(env, "SHOP_HTTP_ADDR")
	return port, err
}

// adminPort returns the port of the operators' listener (SHOP_ADMIN_ADDR,
// or its default) of a process with env, which serves /metrics, or why
// Prometheus, on another host, cannot scrape it: a loopback host (the
// default's, 127.0.0.1) or port 0 (a free port chosen at start).
func (s Service) adminPort(env map[string]string) (int, error) {
	const what = "the operators' listener, which serves /metrics,"
	addr, host, port, err := s.listener(env, "SHOP_ADMIN_ADDR")
	switch ip := net.ParseIP(host); {
	case err != nil:
		return 0, fmt.Errorf("%s %w", what, err)
	case port < 1 || port > 65535:
		return 0, fmt.Errorf("SHOP_ADMIN_ADDR=%q: %s needs a fixed port for Prometheus to scrape", addr, what)
	case host == "localhost" || ip != nil && ip.IsLoopback():
		return 0, fmt.Errorf("SHOP_ADMIN_ADDR=%q: %s is on the loopback, out of Prometheus's reach; listen on every interface (:9091)", addr, what)
	}
	return port, nil
}

// unknownEnv returns the SHOP_* names in env that the service does not
// read, sorted.
func (s Service) unknownEnv(env map[string]string) []string {
	var unknown []string
	for name := range env {
		if strings.HasPrefix(name, "SHOP_") && !s.Env[name] {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	return unknown
}

// shopSteps returns the shop command lines a command line runs, in order,
// each without the program's name (its subcommand first): shop itself (or
// a path ending in /shop), or `sh -c` with shop commands joined by &&, each
// of which runs only if the one before succeeded. A step that is not a shop
// command is nil.
func shopSteps(argv []string) [][]string {
	if len(argv) != 3 || (argv[0] != "sh" && argv[0] != "/bin/sh") || argv[1] != "-c" {
		return [][]string{shopStep(argv)}
	}
	var steps [][]string
	for cmd := range strings.SplitSeq(argv[2], "&&") {
		steps = append(steps, shopStep(strings.Fields(cmd)))
	}
	return steps
}

// shopStep returns the subcommand and arguments of a shop command line, or
// nil when argv is not one.
func shopStep(argv []string) []string {
	if len(argv) < 2 || (argv[0] != "shop" && !strings.HasSuffix(argv[0], "/shop")) {
		return nil
	}
	return argv[1:]
}

// setupSeed returns the arguments of the shop seed that steps run after
// shop migrate; ok is false when they run no such seed.
func setupSeed(steps [][]string) (seed []string, ok bool) {
	mi := slices.IndexFunc(steps, func(s []string) bool { return len(s) > 0 && s[0] == "migrate" })
	if mi < 0 {
		return nil, false
	}
	si := slices.IndexFunc(steps[mi+1:], func(s []string) bool { return len(s) > 0 && s[0] == "seed" })
	if si < 0 {
		return nil, false
	}
	return steps[mi+1+si][1:], true
}

// seedsIfEmpty reports whether shop seed's arguments turn --if-empty on,
// as the flag package reads them: -if-empty or --if-empty, alone or with
// a true value, the last one counting.
func seedsIfEmpty(args []string) bool {
	on := false
	for _, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "if-empty" {
			continue
		}
		on = true
		if hasValue {
			on, _ = strconv.ParseBool(value)
		}
	}
	return on
}

// seedWithoutIfEmpty is the problem of a setup whose seed resets the
// catalog each time it runs; the caller says when that is.
const seedWithoutIfEmpty = "runs shop seed without --if-empty, which resets the catalog, deleting every order,"
