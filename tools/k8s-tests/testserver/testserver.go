// Package testserver stands in for k8s.io/apiserver's pkg/storage/etcd3/testserver when
// Kubernetes' storage tests run against cetera: tools/k8s-tests/run.sh rewrites that import
// in a scratch copy of k8s.io/apiserver to this package. It keeps the same two functions,
// so the tests are unchanged. Each RunEtcd starts a fresh cetera process (its own SQLite
// file in the test's temp dir, or its own database on the server CETERA_TEST_ENDPOINT
// names) and stops it when the test ends.
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
// it answers, and returns a client wrapped as etcd's testserver wraps it. The server is
// stopped when the test ends.
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
	endpoint, dropDatabase, err := databaseFor(cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}

	portLock.Lock()
	address, err := freeAddress()
	if err != nil {
		portLock.Unlock()
		t.Fatal(err)
	}
	args := []string{
		"--listen-address", address,
		"--endpoint", endpoint,
		"--watch-progress-notify-interval", progressNotifyInterval(cfg).String(),
	}
	if cfg.QuotaBackendBytes != 0 {
		args = append(args, "--quota-backend-bytes", strconv.FormatInt(cfg.QuotaBackendBytes, 10))
	}
	logPath := filepath.Join(cfg.Dir, "cetera.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		portLock.Unlock()
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), "RUST_LOG="+envOr("CETERA_TEST_LOG", "warn"))
	if err := cmd.Start(); err != nil {
		portLock.Unlock()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		stop(cmd, exited)
		logFile.Close()
		if t.Failed() {
			if out, err := os.ReadFile(logPath); err == nil && len(out) > 0 {
				t.Logf("cetera %s log:\n%s", strings.Join(args, " "), tail(string(out), 8000))
			}
		}
		if dropDatabase != nil {
			if err := dropDatabase(); err != nil {
				t.Logf("dropping the test database: %v", err)
			}
		}
	})
	err = waitReady(address, cmd, exited)
	portLock.Unlock()
	if err != nil {
		out, _ := os.ReadFile(logPath)
		t.Fatalf("cetera did not start: %v\n%s", err, tail(string(out), 8000))
	}

	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   []string{"http://" + address},
		DialTimeout: 10 * time.Second,
		Logger:      zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel)).Named("etcd-client"),
	})
	if err != nil {
		t.Fatal(err)
	}
	recorder := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	client.KV = storagetesting.NewKVRecorder(client.KV, recorder)
	client.Kubernetes = recorder
	return client
}

// progressNotifyInterval is the interval etcd would use for cfg: its own default of ten
// minutes when the test leaves the field zero, as embed.NewConfig does.
func progressNotifyInterval(cfg *embed.Config) time.Duration {
	if cfg.WatchProgressNotifyInterval <= 0 {
		return 10 * time.Minute
	}
	return cfg.WatchProgressNotifyInterval
}

// freeAddress returns a loopback address whose port was free a moment ago.
func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("could not bind to a port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
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

// stop ends cetera as an operator would (SIGTERM), killing it if it lingers.
func stop(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
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
