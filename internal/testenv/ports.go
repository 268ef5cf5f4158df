package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
)

// ports are the ports freePort has handed out in this process, so that it
// never hands out one twice while the server it was meant for starts.
var ports struct {
	sync.Mutex
	given map[int]bool
}

// freePort returns a loopback port that was free a moment ago, for a server
// that a test is about to start on it.
//
// It is taken below the kernel's ephemeral range, at random. A port of that
// range (where a listener on port 0 gets its port) is also any outgoing
// connection's source port: between the moment a port is found free and the
// moment a server binds it, a connection of any process on the machine, a
// JVM's to its peers among them, can take it, and the server fails to start.
// Below the range only a listener can take it, and listeners bind what they
// were told.
func freePort(tb testing.TB) string {
	tb.Helper()
	lo, hi := portRange()
	ports.Lock()
	defer ports.Unlock()
	if ports.given == nil {
		ports.given = make(map[int]bool)
	}
	for range 1000 {
		port := lo + rand.IntN(hi-lo)
		if ports.given[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		ports.given[port] = true
		return strconv.Itoa(port)
	}
	tb.Fatalf("no free loopback port in [%d, %d)", lo, hi)
	return ""
}

// portRange returns the ports freePort chooses from: the 16384 below the
// ephemeral range, which starts at 32768 unless the machine says otherwise.
func portRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var a, z int
		if n, _ := fmt.Sscan(string(b), &a, &z); n == 2 && a > 1024 {
			hi = a
		}
	}
	return max(hi-16384, 1024), hi
}

// FreeAddr returns a loopback address, 127.0.0.1 and a port of freePort's,
// that nothing listened on a moment ago: for a server a test starts itself,
// or for an address where nothing answers. A listener on port 0 gets an
// ephemeral port, which any outgoing connection on the machine may take
// before the server binds it.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", freePort(tb))
}
