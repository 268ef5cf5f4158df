package testenv

import (
	"errors"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is a server process that a test started, tied to the test binary
// (startTied), which the test can stop, signal and ask for its pid from
// any goroutine. RedisProc, MariaDBProc and the members of an etcd cluster
// and of a ZooKeeper ensemble each embed one.
type proc struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited <-chan struct{} // closed once cmd has exited and been waited for
}

// errRunning is start's error while the process runs.
var errRunning = errors.New("already running")

// start starts cmd as the process, unless it runs (errRunning); one that
// has exited by itself is replaced. It returns the channel closed once cmd
// has exited.
func (p *proc) start(cmd *exec.Cmd) (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			return nil, errRunning
		}
	}
	exited, err := startTied(cmd)
	if err != nil {
		return nil, err
	}
	p.cmd, p.exited = cmd, exited
	return exited, nil
}

// end sends sig to the process — after SIGCONT, so that a paused one ends
// too — and waits until it has exited, killing it if it has not within
// grace. It does nothing while the process is stopped.
func (p *proc) end(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd, p.exited = nil, nil
}

// kill stops the process at once (SIGKILL), as a crash does.
func (p *proc) kill() { p.end(syscall.SIGKILL, time.Minute) }

// signal sends sig to the process, if it runs.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.cmd.Process.Signal(sig)
	}
}

// pid is the process's id, 0 while it is stopped or once it has exited by
// itself.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	select {
	case <-p.exited:
		return 0
	default:
	}
	return p.cmd.Process.Pid
}
