//go:build !linux

package testenv

import "os/exec"

// tie does nothing where the kernel has no parent-death signal (macOS): a
// child there outlives a test binary that panics, as before.
func tie(cmd *exec.Cmd) {}
