//go:build !failpoints

package failpoint_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"shop/internal/failpoint"
)

// deps lists the packages a build of shop/cmd/shop links, with the given
// build tags.
func deps(t *testing.T, tags string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-tags", tags, "-f", "{{.ImportPath}}", "shop/cmd/shop").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	return strings.Fields(string(out))
}

// A default `shop serve` has no failpoint: gofail is not linked at all, so
// neither GOFAIL_FAILPOINTS nor GOFAIL_HTTP can reach one.
func TestDefaultBuildHasNoFailpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs go list")
	}
	const gofail = "go.etcd.io/gofail/runtime"
	h := failpoint.New()
	if h.BeforeWrite != nil || h.BeforeReturn != nil || h.After != nil || h.BetweenRefundCallAndRecord != nil {
		t.Error("a default build hands out hooks")
	}
	if slices.Contains(deps(t, ""), gofail) {
		t.Errorf("a default build of shop links %s", gofail)
	}
	if !slices.Contains(deps(t, "failpoints"), gofail) {
		t.Errorf("a -tags failpoints build of shop does not link %s: the demo's binary has no failpoints", gofail)
	}
}
