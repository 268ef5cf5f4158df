package validate_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// The image: the Dockerfile, parsed with BuildKit's parser (the one `docker
// build` runs), and its build context, filtered by .dockerignore with
// Docker's own matcher. Both are libraries of the Docker tools, so they
// are dependencies of these tests only.

// parseDockerfile parses the Dockerfile at path into its instructions
// (each node's Value is the instruction as written: FROM, from…).
func parseDockerfile(path string) ([]*parser.Node, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return res.AST.Children, nil
}

// args returns an instruction's arguments.
func args(n *parser.Node) []string {
	var out []string
	for a := n.Next; a != nil; a = a.Next {
		out = append(out, a.Value)
	}
	return out
}

// namedPort is a port written in a command: host:port, a URL's.
var namedPort = regexp.MustCompile(`:(\d+)\b`)

// checkDockerfile checks the image's health check: the final stage has a
// HEALTHCHECK that runs `shop healthcheck` in the exec form (no shell
// needed), which asks the port SHOP_HTTP_ADDR names, and names no port of
// its own, which a replica configured to listen elsewhere would not
// answer on.
func checkDockerfile(path string) error {
	nodes, err := parseDockerfile(path)
	if err != nil {
		return err
	}
	var health *parser.Node
	for _, n := range nodes {
		switch strings.ToLower(n.Value) {
		case "from":
			health = nil // a stage's HEALTHCHECK is its own image's
		case "healthcheck":
			health = n
		}
	}
	if health == nil || health.Next == nil {
		return errors.New("Dockerfile: the final stage has no HEALTHCHECK: nothing tells Docker, or nginx's depends_on, when a replica is ready")
	}
	where := fmt.Sprintf("Dockerfile line %d: HEALTHCHECK", health.StartLine)
	if !strings.EqualFold(health.Next.Value, "CMD") {
		return fmt.Errorf("%s %s; want CMD [\"shop\", \"healthcheck\"]", where, health.Next.Value)
	}
	cmd := args(health.Next)
	var problems []error
	if m := namedPort.FindStringSubmatch(strings.Join(cmd, " ")); m != nil {
		problems = append(problems, fmt.Errorf("%s names port %s (%q): shop listens on the port of SHOP_HTTP_ADDR, which `shop healthcheck` follows", where, m[1], health.Original))
	}
	if !health.Attributes["json"] || !slices.Equal(cmd, []string{"shop", "healthcheck"}) {
		problems = append(problems, fmt.Errorf("%s runs %q; want CMD [\"shop\", \"healthcheck\"]: no shell or wget needed", where, cmd))
	}
	return errors.Join(problems...)
}

// contextSources returns the paths the Dockerfile copies from the build
// context: the sources of every COPY and ADD without --from.
func contextSources(path string) ([]string, error) {
	nodes, err := parseDockerfile(path)
	if err != nil {
		return nil, err
	}
	var sources []string
	for _, n := range nodes {
		if inst := strings.ToLower(n.Value); (inst != "copy" && inst != "add") || slices.ContainsFunc(n.Flags, func(f string) bool { return strings.HasPrefix(f, "--from=") }) {
			continue
		}
		a := args(n)
		for _, src := range a[:len(a)-1] {
			sources = append(sources, filepath.ToSlash(filepath.Clean(src)))
		}
	}
	return sources, nil
}

// ignored reports whether matcher leaves path (slash-separated, relative to
// the context) out of the build context, matching it and each of its
// parents in turn, as the builder walks the context.
func ignored(pm *patternmatcher.PatternMatcher, path string) (bool, error) {
	var (
		info    patternmatcher.MatchInfo
		matched bool
		err     error
	)
	parts := strings.Split(path, "/")
	for i := range parts {
		if matched, info, err = pm.MatchesUsingParentResults(strings.Join(parts[:i+1], "/"), info); err != nil {
			return false, err
		}
	}
	return matched, nil
}

// alwaysSent are what the build needs from the context, whatever the
// Dockerfile's COPY lines say: the module's files and its packages' sources.
var alwaysSent = []string{"go.mod", "go.sum", "cmd", "internal", "migrations"}

// neverSent are paths that must stay out of the build context, whether or
// not they exist now: live MariaDB files, the demo's output, built
// binaries, the repository, test binaries and profiles.
var neverSent = []string{
	".state/stack/mariadb/ibdata1", ".state/demo/mariadb/mysql.sock", ".state/stack/redis/dump.rdb",
	"out/demo/report.md", "bin/shop", ".git", ".git/HEAD",
	"shop.test", "cmd/shop/shop.test", "internal/stock/stock.test", "cover.out", "internal/cache/cpu.out",
}

// isTestOutput reports whether a file is a test binary or a profile.
func isTestOutput(path string) bool {
	return strings.HasSuffix(path, ".test") || strings.HasSuffix(path, ".out")
}

// checkDockerignore checks the build context that the .dockerignore at
// ignorePath leaves of the repository at repo: every file (found on disk)
// of alwaysSent and of the sources the Dockerfile at dockerfile copies is
// sent, but test binaries; the paths of neverSent are not.
func checkDockerignore(ignorePath, dockerfile, repo string) error {
	f, err := os.Open(ignorePath)
	if err != nil {
		return fmt.Errorf("%w: without it the whole checkout, .state/'s live MariaDB files included, is sent to the builder", err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return fmt.Errorf("%s: %w", ignorePath, err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return fmt.Errorf("%s: %w", ignorePath, err)
	}
	sources, err := contextSources(dockerfile)
	if err != nil {
		return err
	}
	var problems []error
	var copied []string
	for _, src := range slices.Compact(slices.Sorted(slices.Values(slices.Concat(alwaysSent, sources)))) {
		err := filepath.WalkDir(filepath.Join(repo, src), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(repo, path)
			copied = append(copied, filepath.ToSlash(rel))
			return err
		})
		if err != nil {
			return fmt.Errorf("the build needs %s: %w", src, err)
		}
	}
	for _, path := range copied {
		if isTestOutput(path) {
			continue
		}
		if out, err := ignored(pm, path); err != nil {
			return err
		} else if out {
			problems = append(problems, fmt.Errorf("%s: %s is left out of the build context, but the build needs it", ignorePath, path))
		}
	}
	for _, path := range slices.Concat(neverSent, slices.DeleteFunc(copied, func(p string) bool { return !isTestOutput(p) })) {
		if out, err := ignored(pm, path); err != nil {
			return err
		} else if !out {
			problems = append(problems, fmt.Errorf("%s: %s is sent to the builder", ignorePath, path))
		}
	}
	return errors.Join(problems...)
}

func TestDockerfile(t *testing.T) {
	if err := checkDockerfile(filepath.Join(repoDir, "Dockerfile")); err != nil {
		t.Fatal(err)
	}
}

// TestDockerfileRejectsBrokenCopies breaks a copy of the Dockerfile in one
// way per case and expects the check to reject it, naming the problem.
func TestDockerfileRejectsBrokenCopies(t *testing.T) {
	const (
		df    = "Dockerfile"
		check = `CMD ["shop", "healthcheck"]`
	)
	for _, tc := range []brokenCase{
		{"wget on a fixed port", []edit{{df, check, "CMD wget -q -O /dev/null http://127.0.0.1:8080/readyz || exit 1"}}, "names port 8080"},
		{"a port given to shop healthcheck", []edit{{df, check, `CMD ["shop", "healthcheck", "--addr", "127.0.0.1:9090"]`}}, "names port 9090"},
		{"shell form", []edit{{df, check, "CMD shop healthcheck"}}, `runs ["shop healthcheck"]; want CMD ["shop", "healthcheck"]`},
		{"health check off", []edit{{df, check, "NONE"}}, "HEALTHCHECK NONE"},
		{"no health check", []edit{{df, "HEALTHCHECK --interval=2s --timeout=3s --retries=30 " + check + "\n", ""}}, "the final stage has no HEALTHCHECK"},
		{"health check of the build stage only", []edit{
			{df, "HEALTHCHECK --interval=2s --timeout=3s --retries=30 " + check + "\n", ""},
			{df, "WORKDIR /src\n", "WORKDIR /src\nHEALTHCHECK " + check + "\n"},
		}, "the final stage has no HEALTHCHECK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := brokenCopy(t, repoDir, []string{df}, tc.edits)
			wantRejected(t, checkDockerfile(filepath.Join(dir, df)), tc.want)
		})
	}
}

func TestDockerignore(t *testing.T) {
	if err := checkDockerignore(filepath.Join(repoDir, ".dockerignore"), filepath.Join(repoDir, "Dockerfile"), repoDir); err != nil {
		t.Fatal(err)
	}
}

// TestDockerignoreRejectsBrokenCopies breaks a copy of .dockerignore (or of
// the Dockerfile) in one way per case and expects the check to reject it.
func TestDockerignoreRejectsBrokenCopies(t *testing.T) {
	const (
		di = ".dockerignore"
		df = "Dockerfile"
	)
	for _, tc := range []brokenCase{
		{"everything sent", []edit{{di, "\n*\n", "\n"}}, ".state/stack/mariadb/ibdata1 is sent to the builder"},
		{"bin let in", []edit{{di, "!migrations/\n", "!migrations/\n!bin/\n"}}, "bin/shop is sent to the builder"},
		{"state let in", []edit{{di, "!migrations/\n", "!migrations/\n!.state\n"}}, ".state/stack/mariadb/ibdata1 is sent to the builder"},
		{"demo output let in", []edit{{di, "!migrations/\n", "!migrations/\n!out/\n"}}, "out/demo/report.md is sent to the builder"},
		{"repository let in", []edit{{di, "!migrations/\n", "!migrations/\n!.git\n"}}, ".git is sent to the builder"},
		{"test binaries let in", []edit{{di, "**/*.test\n", ""}}, "cmd/shop/shop.test is sent to the builder"},
		{"sources left out", []edit{{di, "!internal/\n", ""}}, "internal/stock/catalog.go is left out of the build context, but the build needs it"},
		{"module file left out", []edit{{di, "!go.sum\n", ""}}, "go.sum is left out"},
		{"a new source not let in", []edit{{df, "COPY migrations ./migrations\n", "COPY migrations ./migrations\nCOPY loadtest ./loadtest\n"}}, "loadtest/main.go is left out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := brokenCopy(t, repoDir, []string{di, df}, tc.edits)
			wantRejected(t, checkDockerignore(filepath.Join(dir, di), filepath.Join(dir, df), repoDir), tc.want)
		})
	}
	t.Run("no .dockerignore", func(t *testing.T) {
		wantRejected(t, checkDockerignore(filepath.Join(t.TempDir(), di), filepath.Join(repoDir, df), repoDir), "the whole checkout")
	})
}
