package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pair is a primary and a standby streaming its WAL (physical streaming
// replication), each a Cluster of its own on a loopback port: what a
// failover needs. The standby made by pg_basebackup -R reaches the primary
// through a Proxy (Link), which a test partitions so that the standby falls
// behind while the primary keeps committing. Clients reach each node
// through a Proxy of its own too (its front), so that a crash can make a
// host vanish rather than reset its connections; URL names both fronts in
// a multi-host connection string with target_session_attrs=read-write, as
// an application configured for an HA pair would.
//
// The pair's life: StartPair; Crash the primary; Promote the standby,
// which from then on is Primary; Rejoin the old primary as a standby of
// the new one (pg_rewind), if the test wants both hosts of URL to answer
// again. Stop stops both.
type Pair struct {
	nodes    [2]*Cluster
	fronts   [2]*Proxy // the clients' path to each node
	primary  int       // index of the current primary in nodes
	settings []string
	links    []*Proxy
	link     *Proxy // the current standby's path to the primary
	down     [2]bool
}

// CrashMode is how the primary goes away in Crash.
type CrashMode int

const (
	// CrashProcess kills the server (pg_ctl stop -m immediate): its
	// host's kernel resets every connection, so clients learn at once.
	CrashProcess CrashMode = iota
	// CrashHost makes the host vanish (its front is blackholed, then the
	// server killed behind it): established connections hang without an
	// error, new ones are never answered, and clients learn only by their
	// own timeouts (connect_timeout, statement deadlines, TCP keepalive),
	// as when a machine, its network or its zone is lost.
	CrashHost
)

// blackholeLimit bounds how long a crashed host stays vanished if the
// test never rejoins it.
const blackholeLimit = 10 * time.Minute

// PairOptions configure a Pair.
type PairOptions struct {
	// Settings are extra server settings (name=value) of both nodes.
	Settings []string
	// Synchronous makes every commit on the first primary wait until the
	// standby has flushed its WAL (synchronous_standby_names): a failover
	// then loses nothing a client was told committed. Without it
	// replication is asynchronous, the default of most HA setups.
	Synchronous bool
}

// standbyName is the standby's application_name on the primary
// (pg_stat_replication, synchronous_standby_names).
const standbyName = "chaos_standby"

// replicationSettings are what both nodes run with: WAL for a standby, and
// what pg_rewind needs (wal_log_hints, full_page_writes) to rejoin an old
// primary. A standby retries a lost connection every second and keeps
// enough WAL to catch up after a partition healed.
var replicationSettings = []string{
	"wal_level=replica", "max_wal_senders=10", "hot_standby=on", "wal_log_hints=on", "full_page_writes=on",
	"wal_keep_size=256MB", "wal_retrieve_retry_interval=1s", "wal_receiver_status_interval=1s",
}

// StartPair creates and starts a primary under dir/a and a standby of it
// under dir/b (dir must not exist), and waits until the standby streams.
func StartPair(ctx context.Context, dir string, opts PairOptions) (_ *Pair, err error) {
	p := &Pair{settings: append(append([]string{}, replicationSettings...), opts.Settings...)}
	defer func() {
		if err != nil {
			_ = p.Stop(context.WithoutCancel(ctx))
		}
	}()
	primarySettings := p.settings
	if opts.Synchronous {
		primarySettings = append(append([]string{}, p.settings...), "synchronous_standby_names="+standbyName)
	}
	if p.nodes[0], err = StartCluster(ctx, filepath.Join(dir, "a"), primarySettings...); err != nil {
		return nil, fmt.Errorf("primary: %w", err)
	}
	// pg_rewind runs the old primary's crash recovery in a single-user
	// server, which reads no command line: wal_log_hints, and the WAL
	// pg_rewind reads back to the last common checkpoint, must be asked
	// for in its data directory too (the standby's copy comes with the
	// base backup).
	for _, set := range []string{`ALTER SYSTEM SET wal_log_hints = on`, `ALTER SYSTEM SET wal_keep_size = '256MB'`} {
		if err := execOn(ctx, p.nodes[0], set); err != nil {
			return nil, err
		}
	}
	if p.nodes[1], err = newCluster(filepath.Join(dir, "b"), p.settings); err != nil {
		return nil, fmt.Errorf("standby: %w", err)
	}
	p.down[1] = true
	if out, err := p.nodes[1].run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", fmt.Sprint(p.nodes[0].Port), "-U", "postgres",
		"-D", filepath.Join(p.nodes[1].Dir, "data"), "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return nil, fmt.Errorf("pg_basebackup: %v: %s", err, out)
	}
	if err := p.follow(ctx, 1); err != nil {
		return nil, err
	}
	for i, c := range p.nodes {
		if p.fronts[i], err = NewProxy(fmt.Sprintf("127.0.0.1:%d", c.Port)); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// follow starts node i as a standby of the current primary, through a new
// link, and waits until it streams.
func (p *Pair) follow(ctx context.Context, i int) error {
	link, err := NewProxy(fmt.Sprintf("127.0.0.1:%d", p.Primary().Port))
	if err != nil {
		return err
	}
	p.links = append(p.links, link)
	p.link = link
	host, port, _ := strings.Cut(link.Addr(), ":")
	data := filepath.Join(p.nodes[i].Dir, "data")
	// Later lines of postgresql.auto.conf win over the one pg_basebackup -R
	// wrote: the standby streams through the link, under its name.
	conf, err := os.OpenFile(filepath.Join(data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(conf, "primary_conninfo = 'host=%s port=%s user=postgres application_name=%s'\n", host, port, standbyName)
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(data, "standby.signal"), nil, 0o600); err != nil {
		return err
	}
	if err := chownToCluster(p.nodes[i], filepath.Join(data, "standby.signal")); err != nil {
		return err
	}
	if err := p.nodes[i].Start(ctx); err != nil {
		return fmt.Errorf("standby: %w", err)
	}
	p.down[i] = false
	return p.waitStreaming(ctx)
}

// chownToCluster gives path to the user the cluster's server runs as.
func chownToCluster(c *Cluster, path string) error {
	if len(c.asPG) == 0 {
		return nil
	}
	st, err := os.Stat(c.Dir)
	if err != nil {
		return err
	}
	owner, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	return os.Chown(path, int(owner.Uid), int(owner.Gid))
}

// waitStreaming waits until the primary has a streaming standby.
func (p *Pair) waitStreaming(ctx context.Context) error {
	return poll(ctx, time.Minute, "the standby to stream", func(ctx context.Context) (bool, error) {
		var n int
		err := queryRow(ctx, p.Primary(), `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`,
			[]any{standbyName}, &n)
		return err == nil && n > 0, nil
	})
}

// Primary is the node that is primary now.
func (p *Pair) Primary() *Cluster { return p.nodes[p.primary] }

// Standby is the other node: the standby, or, after Promote, the old
// primary (down until Rejoin).
func (p *Pair) Standby() *Cluster { return p.nodes[1-p.primary] }

// Link is the current standby's path to the primary: Partition it and the
// standby falls behind.
func (p *Pair) Link() *Proxy { return p.link }

// URL returns a multi-host connection string naming both nodes' fronts,
// first the first primary's, that connects to whichever accepts writes
// (target_session_attrs=read-write), as an application configured for an
// HA pair would: what the processes under test are given.
func (p *Pair) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@%s,%s/%s?sslmode=disable&target_session_attrs=read-write",
		p.fronts[0].Addr(), p.fronts[1].Addr(), database)
}

// AdminURL is URL naming the nodes themselves, not their fronts: a crash
// resets its connections even in CrashHost mode. For the test's own
// reads, which must not wait on a vanished host.
func (p *Pair) AdminURL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
		p.nodes[0].Port, p.nodes[1].Port, database)
}

// WaitCaughtUp waits until the standby has replayed everything the primary
// had written when it was called.
func (p *Pair) WaitCaughtUp(ctx context.Context, within time.Duration) error {
	var target string
	if err := queryRow(ctx, p.Primary(), `SELECT pg_current_wal_lsn()::text`, nil, &target); err != nil {
		return fmt.Errorf("primary's WAL position: %w", err)
	}
	return poll(ctx, within, "the standby to replay "+target, func(ctx context.Context) (bool, error) {
		var caught bool
		err := queryRow(ctx, p.Standby(), `SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, []any{target}, &caught)
		return err == nil && caught, nil
	})
}

// Tail is what a crash of the primary left the standby without.
type Tail struct {
	// PrimaryLSN is the primary's WAL position read just before it
	// crashed (pg_current_wal_lsn), ReceivedLSN the standby's last
	// received position after it (pg_last_wal_receive_lsn).
	PrimaryLSN, ReceivedLSN string
	// Lost is how many bytes of WAL the primary had written that the
	// standby never received (0 when it had them all).
	Lost int64
}

// Crash stops the primary at once (pg_ctl stop -m immediate: no shutdown
// checkpoint), its clients seeing it as mode says, and reports what the
// standby had received of its WAL by then. The WAL position is read just
// before the crash, so Lost is a lower bound.
func (p *Pair) Crash(ctx context.Context, mode CrashMode) (Tail, error) {
	var t Tail
	if err := queryRow(ctx, p.Primary(), `SELECT pg_current_wal_lsn()::text`, nil, &t.PrimaryLSN); err != nil {
		return t, fmt.Errorf("primary's WAL position: %w", err)
	}
	if mode == CrashHost {
		p.fronts[p.primary].Blackhole(blackholeLimit)
	}
	if out, err := p.Primary().run(ctx, "pg_ctl", "-D", filepath.Join(p.Primary().Dir, "data"), "-m", "immediate", "-w", "-t", "60", "stop"); err != nil {
		return t, fmt.Errorf("pg_ctl stop -m immediate: %v: %s", err, out)
	}
	p.down[p.primary] = true
	var received *string
	if err := queryRow(ctx, p.Standby(), `SELECT pg_last_wal_receive_lsn()::text`, nil, &received); err != nil {
		return t, fmt.Errorf("standby's received WAL position: %w", err)
	}
	if received == nil {
		return t, errors.New("the standby never received WAL by streaming")
	}
	t.ReceivedLSN = *received
	if err := queryRow(ctx, p.Standby(), `SELECT GREATEST(pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn), 0)::bigint`, []any{t.PrimaryLSN, t.ReceivedLSN}, &t.Lost); err != nil {
		return t, err
	}
	return t, nil
}

// Promote promotes the standby (pg_ctl promote) and waits until it accepts
// writes; it is Primary from then on. It returns how long that took.
func (p *Pair) Promote(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	next := 1 - p.primary
	c := p.nodes[next]
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.Dir, "data"), "-w", "-t", "60", "promote"); err != nil {
		return 0, fmt.Errorf("pg_ctl promote: %v: %s", err, out)
	}
	err := poll(ctx, time.Minute, "the promoted standby to accept writes", func(ctx context.Context) (bool, error) {
		var xid string
		return queryRow(ctx, c, `SELECT pg_current_xact_id()::text`, nil, &xid) == nil, nil
	})
	if err != nil {
		return 0, err
	}
	p.primary = next
	if p.link != nil {
		p.link.Close() // its target is the old primary
		p.link = nil
	}
	return time.Since(start), nil
}

// Rejoin makes the old primary, which must be down, a standby of the new
// one: pg_rewind takes back what it wrote that the new primary never
// received (after its crash recovery), then it starts in recovery and
// streams. The multi-host URL's first host then answers again, read-only.
// It returns how long that took.
func (p *Pair) Rejoin(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	old := 1 - p.primary
	if !p.down[old] {
		return 0, errors.New("rejoin: the old primary is running")
	}
	c := p.nodes[old]
	// A primary promoted without waiting for a checkpoint still names the
	// old timeline in its control file, which is where pg_rewind reads it
	// (it would find nothing to rewind).
	if err := execOn(ctx, p.Primary(), `CHECKPOINT`); err != nil {
		return 0, err
	}
	source := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres", p.Primary().Port)
	if out, err := c.run(ctx, "pg_rewind", "--target-pgdata", filepath.Join(c.Dir, "data"), "--source-server", source, "--no-sync"); err != nil {
		return 0, fmt.Errorf("pg_rewind: %v: %s", err, out)
	}
	// The old primary's own settings (synchronous_standby_names) are on
	// its command line, not in its data directory: as a standby it runs
	// with the pair's common settings.
	c.settings = p.settings
	if err := p.follow(ctx, old); err != nil {
		return 0, err
	}
	p.fronts[old].EndBlackhole() // the host is back
	return time.Since(start), nil
}

// Stop stops both nodes (those still running) and closes the links.
func (p *Pair) Stop(ctx context.Context) error {
	var errs []error
	for i, c := range p.nodes {
		if c == nil || p.down[i] {
			continue
		}
		if err := c.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
		p.down[i] = true
	}
	for _, l := range append(p.links, p.fronts[:]...) {
		if l != nil {
			l.Close()
		}
	}
	return errors.Join(errs...)
}

// queryRow runs one query on the postgres database of c, on a connection
// of its own (the node may just have crashed or been promoted), within
// 10 s, and scans its row into dest.
func queryRow(ctx context.Context, c *Cluster, sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// execOn runs one statement on the postgres database of c, on a
// connection of its own, within 10 s.
func execOn(ctx context.Context, c *Cluster, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// poll calls check every 100 ms until it reports done, fails, or within
// passes.
func poll(ctx context.Context, within time.Duration, what string, check func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		done, err := check(ctx)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %s for %s", within, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
