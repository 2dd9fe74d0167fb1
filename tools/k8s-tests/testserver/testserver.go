// Package testserver stands in for k8s.io/apiserver's pkg/storage/etcd3/testserver when
// Kubernetes' storage tests run against cetera: tools/k8s-tests/run.sh rewrites that import
// in a scratch copy of k8s.io/apiserver to this package. It keeps the same two functions,
// so the tests are unchanged. Each RunEtcd starts a fresh cetera process (its own SQLite
// file in the test's temp dir, or its own database on the server CETERA_TEST_ENDPOINT
// names), or with CETERA_TEST_CLUSTER=1 a fresh 3-member replicated cluster (SQLite), and
// stops it when the test ends.
//
// With CETERA_TEST_SERVER=etcd it hands every call to the original package instead (an
// embedded etcd per test), so one test binary gives both the baseline and cetera's run.
package testserver

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	etcdtestserver "k8s.io/apiserver/pkg/storage/etcd3/testserver"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
)

// useEtcd says whether the run is the baseline on embedded etcd.
func useEtcd() bool { return os.Getenv("CETERA_TEST_SERVER") == "etcd" }

// NewTestConfig returns the configuration the tests adjust before RunEtcd: etcd's own
// defaults with a fresh temp dir. Of its fields cetera reads Dir,
// WatchProgressNotifyInterval and QuotaBackendBytes.
func NewTestConfig(t testing.TB) *embed.Config {
	if useEtcd() {
		return etcdtestserver.NewTestConfig(t)
	}
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	return cfg
}

// portLock keeps two servers of one test binary from picking the same free port.
var portLock sync.Mutex

// RunEtcd starts cetera with the given configuration (NewTestConfig(t) if nil), waits until
// it answers, and returns a client wrapped as etcd's testserver wraps it. With
// CETERA_TEST_CLUSTER=1 it starts a 3-member replicated cluster instead (each member on
// SQLite) and the client talks to the second member, a follower. The servers are stopped
// when the test ends.
func RunEtcd(t testing.TB, cfg *embed.Config) *kubernetes.Client {
	t.Helper()
	if useEtcd() {
		return etcdtestserver.RunEtcd(t, cfg)
	}
	if cfg == nil {
		cfg = NewTestConfig(t)
	}
	bin := os.Getenv("CETERA_BIN")
	if bin == "" {
		t.Fatal("CETERA_BIN must name the cetera binary")
	}
	// The flags every server of the test gets.
	common := []string{"--watch-progress-notify-interval", progressNotifyInterval(cfg).String()}
	if cfg.QuotaBackendBytes != 0 {
		common = append(common, "--quota-backend-bytes", strconv.FormatInt(cfg.QuotaBackendBytes, 10))
	}

	var started servers
	var dropDatabase func() error
	t.Cleanup(func() {
		started.stop()
		if t.Failed() {
			for _, m := range started {
				m.logTail(t)
			}
		}
		if dropDatabase != nil {
			if err := dropDatabase(); err != nil {
				t.Logf("dropping the test database: %v", err)
			}
		}
	})

	portLock.Lock()
	var client string
	var err error
	if os.Getenv("CETERA_TEST_CLUSTER") == "1" {
		client, err = started.startCluster(bin, cfg.Dir, common)
	} else {
		var endpoint string
		endpoint, dropDatabase, err = databaseFor(cfg.Dir)
		if err == nil {
			client, err = started.startServer(bin, cfg.Dir, endpoint, common)
		}
	}
	portLock.Unlock()
	if err != nil {
		t.Fatal(err)
	}

	c, err := kubernetes.New(clientv3.Config{
		Endpoints:   []string{"http://" + client},
		DialTimeout: 10 * time.Second,
		Logger:      zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel)).Named("etcd-client"),
	})
	if err != nil {
		t.Fatal(err)
	}
	recorder := storagetesting.NewKubernetesRecorder(c.Kubernetes)
	c.KV = storagetesting.NewKVRecorder(c.KV, recorder)
	c.Kubernetes = recorder
	return c
}

// servers are the cetera processes of one test.
type servers []*member

// startServer starts one cetera on endpoint and returns its client address.
func (s *servers) startServer(bin, dir, endpoint string, common []string) (string, error) {
	addresses, err := freeAddresses(1)
	if err != nil {
		return "", err
	}
	args := append([]string{"--listen-address", addresses[0], "--endpoint", endpoint}, common...)
	return addresses[0], s.start(bin, dir, addresses[0], args)
}

// startCluster starts a 3-member replicated cluster, each member on a SQLite file of its
// own in dir/nN: n1 founds it (--cluster-init), n2 and n3 join it through n1's peer port,
// all with one token. It returns n2's client address: a follower (n1, the founder, leads),
// which forwards writes to the leader and asks it for a read index before a linearizable
// read, as a real deployment's members do.
func (s *servers) startCluster(bin, dir string, common []string) (string, error) {
	var firstPeer, client string
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("n%d", i)
		addresses, err := freeAddresses(2)
		if err != nil {
			return "", err
		}
		address, peer := addresses[0], addresses[1]
		join := []string{"--join", firstPeer}
		if i == 1 {
			firstPeer = "http://" + peer
			join = []string{"--cluster-init"}
		}
		args := append([]string{
			"--name", name,
			"--listen-address", address,
			"--peer-listen-address", peer,
			"--endpoint", "sqlite://" + filepath.Join(dir, name, "state.db"),
			"--token", "k8s-storage-tests",
		}, join...)
		if err := s.start(bin, filepath.Join(dir, name), address, append(args, common...)); err != nil {
			return "", fmt.Errorf("member %s: %w", name, err)
		}
		if i == 2 {
			client = address
		}
	}
	return client, nil
}

// member is one running cetera process.
type member struct {
	args    []string
	cmd     *exec.Cmd
	exited  chan struct{}
	logFile *os.File
	logPath string
}

// start starts cetera with args, its output in dir/cetera.log, adds it to s (so it is
// stopped even if it never answers) and waits until its client port, address, answers
// /health.
func (s *servers) start(bin, dir, address string, args []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	m := &member{args: args, exited: make(chan struct{}), logPath: filepath.Join(dir, "cetera.log")}
	var err error
	if m.logFile, err = os.Create(m.logPath); err != nil {
		return err
	}
	m.cmd = exec.Command(bin, args...)
	m.cmd.Stdout = m.logFile
	m.cmd.Stderr = m.logFile
	m.cmd.Env = append(os.Environ(), "RUST_LOG="+envOr("CETERA_TEST_LOG", "warn"))
	if err := m.cmd.Start(); err != nil {
		m.logFile.Close()
		return err
	}
	*s = append(*s, m)
	go func() {
		_ = m.cmd.Wait()
		close(m.exited)
	}()
	if err := waitReady(address, m.cmd, m.exited); err != nil {
		out, _ := os.ReadFile(m.logPath)
		return fmt.Errorf("cetera did not start: %v\n%s", err, tail(string(out), 8000))
	}
	return nil
}

// stop ends every server as an operator would (SIGTERM), killing one that lingers; all at
// once, so no member is left running while the others elect a new leader.
func (s servers) stop() {
	var wg sync.WaitGroup
	for _, m := range s {
		wg.Go(m.stop)
	}
	wg.Wait()
}

// stop ends cetera with SIGTERM, killing it if it lingers.
func (m *member) stop() {
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	m.logFile.Close()
}

// logTail logs the end of the member's log into the test's output.
func (m *member) logTail(t testing.TB) {
	if out, err := os.ReadFile(m.logPath); err == nil && len(out) > 0 {
		t.Logf("cetera %s log:\n%s", strings.Join(m.args, " "), tail(string(out), 8000))
	}
}

// progressNotifyInterval is the interval etcd would use for cfg: its own default of ten
// minutes when the test leaves the field zero, as embed.NewConfig does.
func progressNotifyInterval(cfg *embed.Config) time.Duration {
	if cfg.WatchProgressNotifyInterval <= 0 {
		return 10 * time.Minute
	}
	return cfg.WatchProgressNotifyInterval
}

// freeAddresses returns n loopback addresses whose ports were free a moment ago, all
// different (each held open until the last is found).
func freeAddresses(n int) ([]string, error) {
	var addresses []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("could not bind to a port: %w", err)
		}
		defer l.Close()
		addresses = append(addresses, l.Addr().String())
	}
	return addresses, nil
}

// waitReady polls etcd's /health on the client port until cetera reports healthy, the
// process exits, or a minute passes.
func waitReady(address string, cmd *exec.Cmd, exited <-chan struct{}) error {
	httpClient := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("cetera exited: %v", cmd.ProcessState)
		default:
		}
		resp, err := httpClient.Get("http://" + address + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no healthy answer from %s within a minute", address)
}

// databaseFor returns cetera's --endpoint for one test: a SQLite file in dir, or, when
// CETERA_TEST_ENDPOINT names a PostgreSQL or MySQL server (a URL without a database), a
// database of its own on it, named after dir, which cetera creates and the returned
// function drops.
func databaseFor(dir string) (string, func() error, error) {
	server := os.Getenv("CETERA_TEST_ENDPOINT")
	if server == "" {
		return "sqlite://" + filepath.Join(dir, "state.db"), nil, nil
	}
	name := fmt.Sprintf("k8s_%.8x", sha256.Sum256([]byte(dir)))
	u, err := url.Parse(server)
	if err != nil {
		return "", nil, fmt.Errorf("CETERA_TEST_ENDPOINT: %w", err)
	}
	host, port := u.Hostname(), u.Port()
	user := u.User.Username()
	switch u.Scheme {
	case "postgres", "postgresql":
		drop := func() error {
			return run("psql", "-h", host, "-p", envOrValue(port, "5432"), "-U", user, "-d", "postgres",
				"-c", "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		}
		return strings.TrimSuffix(server, "/") + "/" + name, drop, nil
	case "mysql":
		drop := func() error {
			return run("mysql", "-h", host, "-P", envOrValue(port, "3306"), "-u", user,
				"-e", "DROP DATABASE IF EXISTS "+name)
		}
		return strings.TrimSuffix(server, "/") + "/" + name, drop, nil
	default:
		return "", nil, fmt.Errorf("CETERA_TEST_ENDPOINT: unknown scheme %q", u.Scheme)
	}
}

// run runs a database client command, returning its output with any error.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, out)
	}
	return nil
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func envOrValue(v, fallback string) string {
	if v != "" {
		return v
	}
	return fallback
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
