//go:build !failpoints

package failpoint

// New returns the hooks of this binary: none.
func New() Hooks { return Hooks{} }
