//go:build linux

package testenv_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"shop/internal/testenv"
)

// childEnv makes this test binary, started again by
// TestRedisDiesWithTheTestBinary, play the test that dies: its value says
// how.
const childEnv = "SHOP_TESTENV_CHILD"

// TestRedisDiesWithTheTestBinary starts this test binary again as a child
// that starts a redis-server through StartRedis and then dies without
// running its cleanups — by os.Exit, and by go test's -timeout, whose
// panic ends the binary from another goroutine — and checks that the
// redis-server is gone too.
func TestRedisDiesWithTheTestBinary(t *testing.T) {
	if mode := os.Getenv(childEnv); mode != "" {
		dieWithRedis(t, mode)
		return
	}
	testenv.RedisAddr(t) // the servers' rule: -short skips, no server fails
	for _, tt := range []struct{ mode, timeout string }{
		{"exit", "10m"},
		{"timeout", "8s"},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			child := exec.Command(os.Args[0], "-test.run=^TestRedisDiesWithTheTestBinary$", "-test.timeout="+tt.timeout)
			child.Env = append(os.Environ(), childEnv+"="+tt.mode)
			var stderr bytes.Buffer // a timeout's goroutine dump, shown only on failure
			child.Stderr = &stderr
			out, err := child.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			pid, lines := 0, []string{}
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines = append(lines, sc.Text())
				if rest, ok := strings.CutPrefix(sc.Text(), "redis-server pid "); ok {
					pid, _ = strconv.Atoi(rest)
				}
			}
			err = child.Wait()
			if pid == 0 {
				t.Fatalf("the child printed no redis-server pid (exit: %v): %q\n%s", err, lines, stderr.Bytes())
			}
			// If it survived, it must not outlive this test.
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			if err == nil {
				t.Fatalf("the child exited 0; it should have died (%s)", tt.mode)
			}
			deadline := time.Now().Add(10 * time.Second)
			for redisRuns(pid) {
				if time.Now().After(deadline) {
					t.Fatalf("redis-server (pid %d) still runs 10s after its test binary died (%s, %v)", pid, tt.mode, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// dieWithRedis is the child's part: start a redis-server, say its pid, and
// die the way mode says, leaving t's cleanups (which would kill it) unrun.
func dieWithRedis(t *testing.T, mode string) {
	p := testenv.StartRedis(t)
	fmt.Printf("redis-server pid %d\n", p.Pid())
	switch mode {
	case "exit":
		os.Exit(2)
	case "timeout":
		select {} // until -test.timeout's panic
	default:
		t.Fatalf("%s=%q: want exit or timeout", childEnv, mode)
	}
}

// redisRuns tells whether pid is a live redis-server: not gone, not a
// zombie waiting for an init that reaps late, not another program that got
// the pid since.
func redisRuns(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	comm, rest, _ := strings.Cut(string(stat), ") ")
	return strings.Contains(comm, "redis") && !strings.HasPrefix(rest, "Z")
}

// TestRedisOutlivesTheCallersThread calls StartRedis from goroutines
// locked to their OS threads that then return without unlocking them,
// which ends their threads. The parent-death signal follows the thread
// that forked the server, not the process: a server must not die with its
// caller's thread, only with the test binary. (Three of them: one goroutine
// may have run on the main thread, which the runtime never ends.)
func TestRedisOutlivesTheCallersThread(t *testing.T) {
	testenv.RedisAddr(t)
	var procs []*testenv.RedisProc
	for range 3 {
		started := make(chan *testenv.RedisProc)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			started <- testenv.StartRedis(t)
		}()
		procs = append(procs, <-started)
	}
	// A thread ends once its goroutine has returned, and the signal is
	// delivered at once. Look a few times over a second.
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		for _, p := range procs {
			if !redisRuns(p.Pid()) {
				t.Fatalf("redis-server (pid %d) died with the thread that called StartRedis", p.Pid())
			}
		}
	}
	for _, p := range procs {
		if err := testenv.RedisAt(t, p.Addr).Ping(t.Context()).Err(); err != nil {
			t.Fatalf("redis-server after its caller's thread ended: %v", err)
		}
	}
}
