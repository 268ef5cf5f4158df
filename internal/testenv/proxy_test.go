package testenv_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"shop/internal/testenv"
)

// echo serves lines back, upper-cased in nothing: what comes in goes out,
// and every line it received is sent on got.
func echo(t *testing.T) (addr string, got <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lines := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					lines <- sc.Text()
					if _, err := c.Write([]byte(sc.Text() + "\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), lines
}

func TestProxyCutReply(t *testing.T) {
	addr, got := echo(t)
	p := testenv.StartProxy(t, addr)
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	c.Write([]byte("hello\n"))
	if line, err := r.ReadString('\n'); err != nil || line != "hello\n" {
		t.Fatalf("before the cut: %q, %v", line, err)
	}
	cut := p.CutReply([]byte("COMMIT"))
	c.Write([]byte("COMMIT\n"))
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("the reply came through the cut: %q", line)
	}
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatal("the cut was not reported")
	}
	// The server got both requests: the lost reply was to work done.
	for _, want := range []string{"hello", "COMMIT"} {
		if line := <-got; line != want {
			t.Errorf("server got %q, want %q", line, want)
		}
	}
	// New connections go through as before.
	c2, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	c2.Write([]byte("again\n"))
	if line, err := bufio.NewReader(c2).ReadString('\n'); err != nil || line != "again\n" {
		t.Fatalf("after the cut: %q, %v", line, err)
	}
}
