package testenv

import (
	"os/exec"
	"syscall"
)

// tie asks the kernel to SIGKILL cmd's process when the thread that starts
// it ends (Linux's parent-death signal follows the forking thread, not the
// process): startTied keeps that thread for the child's whole life.
func tie(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
