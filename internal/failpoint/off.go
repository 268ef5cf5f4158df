//go:build !failpoints

package failpoint

// Enabled reports whether this binary was built with failpoints.
const Enabled = false

// New returns the hooks of this binary: none.
func New() Hooks { return Hooks{} }
