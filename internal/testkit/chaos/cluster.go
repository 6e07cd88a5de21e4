// Package chaos holds the pieces of the reliability suite: a throwaway
// PostgreSQL cluster that can be restarted without disturbing anything else on
// the machine, a TCP proxy that stalls or cuts a process's database
// connections, and the invariant checker that reads the database after a
// scenario.
package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/fleet/ingest/internal/testkit/testproc"
)

// Cluster is a PostgreSQL cluster of its own: initdb'd in a directory,
// listening on a spare loopback port.
type Cluster struct {
	Dir  string
	Port int
	bin  string
	asPG []string // "runuser -u postgres --" when running as root
	// settings are extra server settings (name=value).
	settings []string
}

// FindPGBin returns the directory holding initdb and pg_ctl.
func FindPGBin() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		// A pg_ctl on PATH may be a link into the installation (Debian's
		// /usr/lib/postgresql/N/bin); the directory wanted is the one
		// that holds its sibling tools too.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(matches) == 0 {
		return "", errors.New("pg_ctl not found: install PostgreSQL server binaries")
	}
	sort.Strings(matches)
	return filepath.Dir(matches[len(matches)-1]), nil
}

// StartCluster creates and starts a cluster under dir (which must not
// exist), with extra server settings ("name=value"). As root it runs the
// server as the postgres user, which initdb requires.
func StartCluster(ctx context.Context, dir string, settings ...string) (*Cluster, error) {
	c, err := newCluster(dir, settings)
	if err != nil {
		return nil, err
	}
	if out, err := c.run(ctx, "initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// newCluster prepares dir (which must not exist) for a cluster on a spare
// loopback port, owned by the postgres user when running as root, without
// creating its data directory.
func newCluster(dir string, settings []string) (*Cluster, error) {
	bin, err := FindPGBin()
	if err != nil {
		return nil, err
	}
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Port: port, bin: bin, settings: settings}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		// Every parent must be traversable by postgres.
		for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
			if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 && d != dir {
				_ = os.Chmod(d, st.Mode().Perm()|0o011)
			}
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		c.asPG = []string{"runuser", "-u", "postgres", "--"}
	}
	return c, nil
}

func (c *Cluster) run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	argv := append(append([]string{}, c.asPG...), append([]string{filepath.Join(c.bin, tool)}, args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func (c *Cluster) options() string {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=300", c.Port, c.Dir)
	for _, s := range c.settings {
		opts += " -c " + s
	}
	return opts
}

// Start starts the server and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.Dir, "data"), "-o", c.options(), "-l", filepath.Join(c.Dir, "server.log"), "-w", "-t", "60", "start")
	if err != nil {
		return fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	return nil
}

// Restart stops the server with mode ("fast" or "immediate", the latter like
// a crash) and starts it again; every connection is dropped.
func (c *Cluster) Restart(ctx context.Context, mode string) (time.Duration, error) {
	start := time.Now()
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.Dir, "data"), "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return 0, fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// Stop stops the server.
func (c *Cluster) Stop(ctx context.Context) error {
	out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.Dir, "data"), "-m", "immediate", "-w", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	return nil
}

// URL returns a connection string for database on the cluster.
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, database)
}
