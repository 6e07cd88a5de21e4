// Package pgbouncertest runs a real PgBouncer (Debian's pgbouncer 1.18, the
// version without protocol-level prepared statements) in transaction pooling
// mode in front of the test server, so tests can run the binaries the way a
// scaled deployment does.
//
// The binary is PGBOUNCER_BIN when set, else pgbouncer on PATH, else
// /usr/sbin/pgbouncer (Debian installs it there, outside most users' PATH).
// When none exists the test fails, naming the command that installs it
// (make test installs Debian's pgbouncer as root, see internal/testkit/testdeps);
// only under go test -short is it skipped.
//
// Each Start runs its own process on a free loopback port with its own
// configuration in a temporary directory, and stops it when the test ends.
// PgBouncer refuses to run as root: when the test runs as root, the process
// runs as the user postgres.
package pgbouncertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/testkit/testdeps"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// EnvBin names the pgbouncer binary to run.
const EnvBin = "PGBOUNCER_BIN"

// Options configure a PgBouncer. Zero values take the defaults.
type Options struct {
	// ServerURL is the PostgreSQL server behind PgBouncer (host, port, user
	// and password are used). Defaults to pgtest.ServerURL.
	ServerURL string
	// PoolSize is default_pool_size: server connections per database and
	// user. Defaults to 20.
	PoolSize int
	// MaxClientConn is max_client_conn. Defaults to 2000.
	MaxClientConn int
	// NoServerReset leaves server connections as their last client left
	// them (server_reset_query_always = 0), as PgBouncer does by default
	// in transaction mode. Without it a PgBouncer runs the configuration
	// the README documents: DISCARD ALL whenever a server connection goes
	// back to the pool, so no client's session state (a SET, a prepared
	// statement, a temporary table) reaches the next client.
	NoServerReset bool
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// Port is its loopback listening port.
	Port int
	logs *testproc.SyncBuffer
}

// Bin returns the pgbouncer binary to run, or an error saying how to get one.
func Bin() (string, error) {
	if b := os.Getenv(EnvBin); b != "" {
		if _, err := os.Stat(b); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvBin, b, err)
		}
		return b, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", errors.New("pgbouncer not found on PATH nor at /usr/sbin/pgbouncer, and PGBOUNCER_BIN is not set")
}

// Start runs a PgBouncer in transaction pooling mode in front of the test
// server and returns it once it accepts connections. It is stopped when the
// test ends, and its log is shown if the test failed.
func Start(t testing.TB, opts Options) *Bouncer {
	t.Helper()
	bin, err := Bin()
	if err != nil {
		testdeps.Missing(t, "pgbouncer", "apt-get install pgbouncer", err)
		return nil
	}
	if opts.ServerURL == "" {
		opts.ServerURL = pgtest.ServerURL(t)
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 20
	}
	if opts.MaxClientConn == 0 {
		opts.MaxClientConn = 2000
	}
	server, err := pgconn.ParseConfig(opts.ServerURL)
	if err != nil {
		t.Fatalf("pgbouncertest: parsing the server URL: %v", err)
	}
	var lastErr error
	for range 3 { // a free port can be taken between its choice and the start
		b, err := start(t, bin, server, opts)
		if err == nil {
			return b
		}
		lastErr = err
	}
	t.Fatalf("pgbouncertest: %v", lastErr)
	return nil
}

func start(t testing.TB, bin string, server *pgconn.Config, opts Options) (*Bouncer, error) {
	b, stop, err := launch(bin, server, opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("pgbouncer logs:\n%s", b.logs.String())
		}
	})
	return b, nil
}

// Launch starts a PgBouncer as Start does, outside a test (the benchmark
// harness): opts.ServerURL is required, and the caller stops it with the
// returned function.
func Launch(opts Options) (*Bouncer, func(), error) {
	bin, err := Bin()
	if err != nil {
		return nil, nil, err
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 20
	}
	if opts.MaxClientConn == 0 {
		opts.MaxClientConn = 2000
	}
	server, err := pgconn.ParseConfig(opts.ServerURL)
	if err != nil {
		return nil, nil, fmt.Errorf("pgbouncertest: parsing the server URL: %w", err)
	}
	return launch(bin, server, opts)
}

// URLFor returns databaseURL pointed at this PgBouncer (see URL).
func (b *Bouncer) URLFor(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", err
	}
	u.Host = b.addr()
	return u.String(), nil
}

func launch(bin string, server *pgconn.Config, opts Options) (*Bouncer, func(), error) {
	port, err := testproc.FreePort()
	if err != nil {
		return nil, nil, err
	}
	// Not a test's TempDir: its directories are private to the test's
	// user, and PgBouncer may run as another.
	dir, err := os.MkdirTemp("", "pgbouncertest-")
	if err != nil {
		return nil, nil, err
	}
	cleanupDir := func() { os.RemoveAll(dir) }
	if err := os.Chmod(dir, 0o755); err != nil {
		cleanupDir()
		return nil, nil, err
	}
	conf := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(conf, []byte(config(server, port, opts)), 0o644); err != nil {
		cleanupDir()
		return nil, nil, err
	}
	cmd := exec.Command(bin, conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		cred, err := postgresUser()
		if err != nil {
			cleanupDir()
			return nil, nil, err
		}
		cmd.SysProcAttr.Credential = cred
	}
	b := &Bouncer{Port: port, logs: &testproc.SyncBuffer{}}
	cmd.Stdout, cmd.Stderr = b.logs, b.logs
	if err := cmd.Start(); err != nil {
		cleanupDir()
		return nil, nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := func() {
		defer cleanupDir()
		select {
		case <-done:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			cleanupDir()
			return nil, nil, fmt.Errorf("pgbouncer exited at start: %s", b.logs.String())
		default:
		}
		c, err := net.DialTimeout("tcp", b.addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			stop()
			return nil, nil, fmt.Errorf("pgbouncer did not listen on %s within 10s: %s", b.addr(), b.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return b, stop, nil
}

// config is the pgbouncer.ini of a PgBouncer on port in front of server:
// transaction pooling, every database passed through as the server's user
// (auth_type any: tests connect over loopback without a password), server
// connections reset after every transaction unless opts.NoServerReset.
func config(server *pgconn.Config, port int, opts Options) string {
	reset := "server_reset_query = DISCARD ALL\nserver_reset_query_always = 1"
	if opts.NoServerReset {
		reset = "server_reset_query =\nserver_reset_query_always = 0"
	}
	conn := fmt.Sprintf("host=%s port=%d user=%s", server.Host, server.Port, server.User)
	if server.Password != "" {
		conn += " password=" + server.Password
	}
	return fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_client_conn = %d
%s
ignore_startup_parameters = extra_float_digits
server_login_retry = 1
log_connections = 0
log_disconnections = 0
`, conn, port, opts.PoolSize, opts.MaxClientConn, reset)
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer refuses to run as root and there is no user postgres to run it as: %w", err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (b *Bouncer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)) }

// URL returns databaseURL pointed at this PgBouncer: the same database,
// user and parameters, PgBouncer's host and port.
func (b *Bouncer) URL(t testing.TB, databaseURL string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatalf("pgbouncertest: parsing %q: %v", databaseURL, err)
	}
	u.Host = b.addr()
	return u.String()
}

// Logs returns what PgBouncer logged so far.
func (b *Bouncer) Logs() string { return b.logs.String() }

// ServerConnections counts the server connections PgBouncer holds to
// database, busy or idle, as the server sees them (pg_stat_activity, read
// through adminURL, a direct connection to the server).
func ServerConnections(ctx context.Context, adminURL, database string) (int, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'`, database).Scan(&n)
	return n, err
}

// DatabaseName returns the database a URL names.
func DatabaseName(databaseURL string) string {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}
