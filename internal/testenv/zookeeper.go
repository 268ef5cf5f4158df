package testenv

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// ZooKeeperHomeEnv names the directory ZooKeeper is installed in; default
// /usr/share/zookeeper (Debian's package, whose jars are in
// /usr/share/java).
const ZooKeeperHomeEnv = "SHOP_TEST_ZK_HOME"

// ZooKeeperEnsemble is a private ensemble of three ZooKeeper servers on
// loopback, for a test that kills its leader or restarts it whole. Each
// server has its data and log in a directory of its own, kept across
// Kill/Start and StopAll/StartAll. Sessions and elections are fast:
// tickTime is 200ms, so a server gives up a silent leader within a second,
// and sessions may last 400ms to 30s.
type ZooKeeperEnsemble struct {
	tb      testing.TB
	java    string
	cp      string
	servers []*zkServer
}

type zkServer struct {
	dir    string
	client string // host:port

	proc
}

// zkJars returns the class path of a ZooKeeper server from home: its jar,
// whose manifest names the jars it needs, and a logging binding.
func zkJars(home string) (string, error) {
	var jars []string
	for _, dir := range []string{filepath.Join(home, "lib"), home, "/usr/share/java"} {
		if m, _ := filepath.Glob(filepath.Join(dir, "zookeeper-3*.jar")); len(m) > 0 {
			jars, _ = filepath.Glob(filepath.Join(dir, "*.jar"))
			if dir == "/usr/share/java" {
				// Debian's jar names its dependencies; not every jar here.
				jars = []string{filepath.Join(dir, "zookeeper.jar"), filepath.Join(dir, "slf4j-simple.jar")}
			}
			break
		}
	}
	for _, j := range jars {
		if _, err := os.Stat(j); err != nil {
			return "", err
		}
	}
	if len(jars) == 0 {
		return "", fmt.Errorf("no zookeeper-3*.jar in %s/lib, %s or /usr/share/java", home, home)
	}
	return strings.Join(jars, string(os.PathListSeparator)), nil
}

// StartZooKeeper starts a private three-server ensemble on free loopback
// ports in a temporary directory, the three at once (a JVM takes seconds to
// start), and waits until it has a leader and every server serves. The
// servers are killed when the test ends, and die with the test binary if
// that ends first.
func StartZooKeeper(tb testing.TB, opts ...Option) *ZooKeeperEnsemble {
	tb.Helper()
	if testing.Short() {
		tb.Skip("a ZooKeeper ensemble is a server; -short runs skip tests that need servers")
	}
	home := os.Getenv(ZooKeeperHomeEnv)
	if home == "" {
		home = "/usr/share/zookeeper"
	}
	cp, err := zkJars(home)
	if err == nil {
		_, err = os.Stat(home)
	}
	java, jerr := exec.LookPath("java")
	if err == nil {
		err = jerr
	}
	if err != nil {
		tb.Fatalf("ZooKeeper (%s=%s): %v", ZooKeeperHomeEnv, home, err)
	}
	e := &ZooKeeperEnsemble{tb: tb, java: java, cp: cp}
	tb.Cleanup(e.killAll)
	root := dataDir(tb, opts)
	// A server that cannot start (a port taken by some other process in
	// the moment before it binds, a JVM that dies) is the machine's fault,
	// not the test's: a new ensemble, on new ports, is tried twice more.
	for attempt := 1; ; attempt++ {
		e.configure(tb, filepath.Join(root, fmt.Sprint("try", attempt)))
		err := e.firstStart()
		if err == nil {
			break
		}
		e.killAll()
		if attempt == 3 {
			tb.Fatal(err)
		}
		tb.Logf("ZooKeeper ensemble, try %d: %v; trying again on new ports", attempt, err)
	}
	e.Leader(tb)
	return e
}

// configure writes the configuration of three servers under root, on new
// free ports.
func (e *ZooKeeperEnsemble) configure(tb testing.TB, root string) {
	tb.Helper()
	e.servers = nil
	var quorum []string
	for i := range 3 {
		s := &zkServer{dir: filepath.Join(root, fmt.Sprint(i+1)), client: "127.0.0.1:" + freePort(tb)}
		e.servers = append(e.servers, s)
		quorum = append(quorum, fmt.Sprintf("server.%d=127.0.0.1:%s:%s", i+1, freePort(tb), freePort(tb)))
	}
	for i, s := range e.servers {
		if err := os.MkdirAll(filepath.Join(s.dir, "data"), 0o755); err != nil {
			tb.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(s.client)
		cfg := append([]string{
			// Short ticks, for short sessions; generous limits in ticks, so
			// that a follower on a loaded machine that takes seconds to
			// load the leader's state, or to answer it, is not taken for
			// lost, which starts the election again and again. A leader
			// killed closes its connections: its followers see it at once.
			"tickTime=200",
			"initLimit=50",
			"syncLimit=15",
			"dataDir=" + filepath.Join(s.dir, "data"),
			"clientPort=" + port,
			"clientPortAddress=127.0.0.1",
			"maxSessionTimeout=30000",
			"4lw.commands.whitelist=srvr,mntr,ruok",
			"admin.enableServer=false",
			"preAllocSize=1024", // KB of transaction log allocated at once, not 64 MB
		}, quorum...)
		write := func(name, text string) {
			if err := os.WriteFile(filepath.Join(s.dir, name), []byte(text), 0o644); err != nil {
				tb.Fatal(err)
			}
		}
		write("zoo.cfg", strings.Join(cfg, "\n")+"\n")
		write("data/myid", fmt.Sprintln(i+1))
	}
}

// firstStart starts the three servers and waits until each serves; it
// returns an error, with the end of its log, if one exits first.
func (e *ZooKeeperEnsemble) firstStart() error {
	e.tb.Helper()
	for i := range e.servers {
		e.start(i)
	}
	for i, s := range e.servers {
		var exited bool
		e.waitUntil(e.tb, fmt.Sprintf("ZooKeeper server %d (%s) serves", i+1, s.client), func() bool {
			exited = !s.running()
			m := mode(s.client)
			return exited || m == "leader" || m == "follower"
		})
		if exited {
			return fmt.Errorf("ZooKeeper server %d exited as it started; the end of %s:\n%s",
				i+1, filepath.Join(s.dir, "zookeeper.log"), logTail(filepath.Join(s.dir, "zookeeper.log"), 10))
		}
	}
	return nil
}

// logTail returns the last n lines of the file at path, or why it cannot.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// Servers returns the client addresses (host:port) of the three servers.
func (e *ZooKeeperEnsemble) Servers() []string {
	addrs := make([]string, len(e.servers))
	for i, s := range e.servers {
		addrs[i] = s.client
	}
	return addrs
}

// Leader waits until one of the running servers says it leads and the
// others that run follow it, and returns its index in Servers.
func (e *ZooKeeperEnsemble) Leader(tb testing.TB) int {
	tb.Helper()
	leader := -1
	e.waitUntil(tb, "the ZooKeeper ensemble has a leader that the running servers follow", func() bool {
		leader = -1
		for i, s := range e.servers {
			if !s.running() {
				continue
			}
			switch mode(s.client) {
			case "leader":
				leader = i
			case "follower":
			default:
				return false
			}
		}
		return leader >= 0
	})
	return leader
}

// Kill stops server i at once (SIGKILL); its data stays.
func (e *ZooKeeperEnsemble) Kill(i int) { e.servers[i].kill() }

// Start starts server i again on its data and waits until it serves: it
// has joined the ensemble's quorum.
func (e *ZooKeeperEnsemble) Start(i int) {
	e.tb.Helper()
	e.start(i)
	e.waitServing(e.tb, i)
}

// StopAll kills every server at once (SIGKILL); their data stays. ZooKeeper
// writes a transaction to its log before it acknowledges it, so nothing
// committed is lost.
func (e *ZooKeeperEnsemble) StopAll() { e.killAll() }

// StartAll starts every server that is not running, at once, and waits
// until the ensemble has a leader that every server follows.
func (e *ZooKeeperEnsemble) StartAll() {
	e.tb.Helper()
	for i, s := range e.servers {
		if !s.running() {
			e.start(i)
		}
	}
	for i := range e.servers {
		e.waitServing(e.tb, i)
	}
	e.Leader(e.tb)
}

func (e *ZooKeeperEnsemble) killAll() {
	var wg sync.WaitGroup
	for _, s := range e.servers {
		wg.Go(s.kill)
	}
	wg.Wait()
}

func (e *ZooKeeperEnsemble) start(i int) {
	e.tb.Helper()
	s := e.servers[i]
	out, err := os.OpenFile(filepath.Join(s.dir, "zookeeper.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.tb.Fatal(err)
	}
	defer out.Close()
	// A small heap, the serial collector and the client compiler: three
	// servers on a small machine start in a few seconds.
	cmd := exec.Command(e.java, "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dorg.slf4j.simpleLogger.logFile="+filepath.Join(s.dir, "zookeeper.log"),
		"-Dzookeeper.log.dir="+s.dir,
		"-cp", e.cp, "org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(s.dir, "zoo.cfg"))
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = out, out
	if _, err := s.start(cmd); err != nil {
		e.tb.Fatalf("start ZooKeeper server %d: %v", i+1, err)
	}
}

// waitServing waits until server i answers srvr with a mode: it is part
// of a quorum that has a leader.
func (e *ZooKeeperEnsemble) waitServing(tb testing.TB, i int) {
	tb.Helper()
	s := e.servers[i]
	e.waitUntil(tb, fmt.Sprintf("ZooKeeper server %d (%s) serves", i+1, s.client), func() bool {
		if !s.running() {
			tb.Fatalf("ZooKeeper server %d exited; see %s", i+1, filepath.Join(s.dir, "zookeeper.log"))
		}
		m := mode(s.client)
		return m == "leader" || m == "follower"
	})
}

func (e *ZooKeeperEnsemble) waitUntil(tb testing.TB, what string, ok func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(60 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mode asks the server at addr for its mode (srvr): "leader", "follower",
// or "" while it does not serve or cannot be reached.
func mode(addr string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "srvr"); err != nil {
		return ""
	}
	out, _ := io.ReadAll(c)
	for line := range strings.Lines(string(out)) {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "Mode: "); ok {
			return m
		}
	}
	return ""
}

// running reports whether the server's process runs.
func (s *zkServer) running() bool { return s.pid() != 0 }
