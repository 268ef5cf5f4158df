package testenv

import (
	"net"
	"strings"
	"testing"
)

// A server whose port another process took before it bound it exits as it
// starts; firstStart says which one, with the end of its log, so that
// StartZooKeeper can try new ports.
func TestZooKeeperFirstStartReportsAServerThatExits(t *testing.T) {
	e := StartZooKeeper(t)
	e.killAll()
	e.configure(t, t.TempDir())
	ln, err := net.Listen("tcp", e.servers[1].client)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = e.firstStart()
	if err == nil || !strings.Contains(err.Error(), "server 2 exited") {
		t.Fatalf("firstStart with server 2's port taken: %v, want server 2 exited", err)
	}
	t.Log(err)
}
