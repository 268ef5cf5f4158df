// Package doclinks checks that every link in README.md and docs/*.md
// resolves: a relative link names a file or directory of the repository,
// and an #anchor names a heading of its target, slugged as GitHub slugs
// it. It is tests only and needs no server.
package doclinks

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestLinks checks the repository's own documentation.
func TestLinks(t *testing.T) {
	root := repoRoot(t)
	files, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	problems, links, err := check(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("%d links in %d files checked", links, len(files))
}

// TestCheckReportsBrokenLinks gives check a small tree with one link of each
// kind, good and broken, and wants exactly the broken ones reported.
func TestCheckReportsBrokenLinks(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", strings.Join([]string{
		"# shop",
		"## Quick start",
		"[ok](docs/a.md) [ok](docs/a.md#the-lock-experiment-make-demo) [ok](#quick-start) [ok](main.go)",
		"[ok](https://go.dev/dl) [ok](docs/) [ok](docs/a.md#a-1)",
		"[missing file](docs/b.md) [missing anchor](docs/a.md#nowhere) [missing here](#quick)",
		"`[in code](docs/none.md)`",
		"```",
		"[in a fence](docs/none.md)",
		"```",
		"[ref]: docs/gone.md",
	}, "\n"))
	write("main.go", "package main\n")
	write("docs/a.md", strings.Join([]string{
		"# A",
		"## The lock experiment (`make demo`)",
		"## A",
		"[up](../README.md#quick-start) [up, missing](../README.md#slow-start)",
	}, "\n"))

	problems, links, err := check(root, []string{"README.md", "docs/a.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`README.md:5: link "docs/b.md": no such file docs/b.md`,
		`README.md:5: link "docs/a.md#nowhere": docs/a.md has no heading with anchor #nowhere`,
		`README.md:5: link "#quick": README.md has no heading with anchor #quick`,
		`README.md:10: link "docs/gone.md": no such file docs/gone.md`,
		`docs/a.md:4: link "../README.md#slow-start": README.md has no heading with anchor #slow-start`,
	}
	if links != 13 {
		t.Errorf("%d links found, want 13", links)
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
}

// TestSlug checks headings against the anchors GitHub gives them.
func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"How an order is placed":                             "how-an-order-is-placed",
		"The lock experiment (`make demo`)":                  "the-lock-experiment-make-demo",
		"Redlock (`SHOP_LOCK_MODE=redlock`)":                 "redlock-shop_lock_moderedlock",
		"One path: the SKU's queue and its drain":            "one-path-the-skus-queue-and-its-drain",
		"Our lock against redsync and bsm/redislock":         "our-lock-against-redsync-and-bsmredislock",
		"Without servers: `-short`":                          "without-servers--short",
		"Down, or only busy?":                                "down-or-only-busy",
		"A quick load: hey and [bin/loadtest](../loadtest/)": "a-quick-load-hey-and-binloadtest",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// repoRoot is the directory of the module's go.mod, above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// docFiles lists README.md and docs/*.md, relative to root.
func docFiles(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return nil, errors.New("no docs/*.md: the documentation is missing")
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			return nil, err
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files, nil
}

// check reads files (slash-separated, relative to root) and returns every
// link among them that does not resolve, as "file:line: link …: why", and
// how many links there were.
func check(root string, files []string) (problems []string, links int, err error) {
	anchors := map[string]map[string]bool{} // by file, relative to root
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := anchors[file]; ok {
			return a, nil
		}
		doc, err := parse(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			return nil, err
		}
		anchors[file] = doc.anchors
		return doc.anchors, nil
	}
	for _, file := range files {
		doc, err := parse(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			return nil, 0, err
		}
		anchors[file] = doc.anchors
		links += len(doc.links)
		for _, l := range doc.links {
			why, err := resolve(root, file, l.target, anchorsOf)
			if err != nil {
				return nil, 0, err
			}
			if why != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: link %q: %s", file, l.line, l.target, why))
			}
		}
	}
	return problems, links, nil
}

// resolve says why target, a link in file, does not resolve, or "" when
// it does. Links with a scheme (https:, mailto:) are not followed.
func resolve(root, file, target string, anchorsOf func(string) (map[string]bool, error)) (string, error) {
	if u, err := url.Parse(target); err != nil {
		return fmt.Sprintf("not a URL: %v", err), nil
	} else if u.Scheme != "" || u.Host != "" {
		return "", nil
	}
	path, anchor, _ := strings.Cut(target, "#")
	path, err := url.PathUnescape(path)
	if err != nil {
		return fmt.Sprintf("bad escape: %v", err), nil
	}
	dest := file
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return "absolute path: link relative to the file", nil
		}
		dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(file), path)))
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "outside the repository", nil
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
			return "no such file " + dest, nil
		}
	}
	// An anchor in a file that is not markdown (a line of code) is GitHub's
	// to resolve.
	if anchor == "" || !strings.HasSuffix(dest, ".md") {
		return "", nil
	}
	anchors, err := anchorsOf(dest)
	if err != nil {
		return "", err
	}
	if !anchors[anchor] {
		return fmt.Sprintf("%s has no heading with anchor #%s", dest, anchor), nil
	}
	return "", nil
}

// link is a link's target and the line it is on.
type link struct {
	target string
	line   int
}

// doc is what check needs of a markdown file.
type doc struct {
	links   []link
	anchors map[string]bool
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional title; the text holds no bracket.
	inlineLink = regexp.MustCompile(`!?\[[^\[\]]*\]\(\s*<?([^()\s<>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// refDef matches a reference definition, [label]: target.
	refDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	// codeSpan matches inline code, whose brackets are not links.
	codeSpan = regexp.MustCompile("(`+)[^`]*?(`+)")
	heading  = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$`)
)

// parse reads the markdown file at path: its links, outside code, and the
// anchors its headings make.
func parse(path string) (doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return doc{}, err
	}
	d := doc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			// GitHub numbers a repeated heading's anchor: a, a-1, a-2.
			s := slug(m[2])
			if n := seen[s]; n > 0 {
				d.anchors[fmt.Sprintf("%s-%d", s, n)] = true
			} else {
				d.anchors[s] = true
			}
			seen[s]++
		}
		text := codeSpan.ReplaceAllString(line, "code")
		for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
			d.links = append(d.links, link{m[1], i + 1})
		}
		if m := refDef.FindStringSubmatch(text); m != nil {
			d.links = append(d.links, link{m[1], i + 1})
		}
	}
	return d, nil
}

// slug is the anchor GitHub gives a heading: its text (links and code
// marks taken out), lower case, without punctuation but hyphens and
// underscores, each space a hyphen.
func slug(h string) string {
	h = inlineLink.ReplaceAllStringFunc(h, func(l string) string {
		return l[strings.Index(l, "[")+1 : strings.Index(l, "](")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-', r == '_', unicode.IsLetter(r), unicode.IsNumber(r), unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
