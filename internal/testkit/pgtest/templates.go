package pgtest

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
)

// The templates pgtestdb clones (testdb_tpl_<hash>, marked datistemplate)
// are shared by every test binary of a run, and by later runs: each is
// migrated once. Every test binary that uses one holds a shared advisory
// lock on templatesLockKey for its whole life (a session of its own, closed
// when the process exits); DropTemplates takes the lock exclusively, so it
// drops the templates only when no test binary is using them. make test
// runs it after the tests (./internal/testkit/pgtest/droptemplates), so a run
// leaves no template behind; the databases of failing tests
// (testdb_tpl_<hash>_inst_<id>) are kept, as their tests say.
const templatesLockKey int64 = 0x66_6c_65_65_74_74_70_6c // "fleettpl"

// templatePattern matches the template databases, not their instances.
const templatePattern = `^testdb_tpl_[0-9a-f]+$`

var (
	templatesUseOnce sync.Once
	templatesUseErr  error
	// templatesConn holds the shared lock. It must stay reachable: a
	// connection only a finished function knew is garbage, and the
	// runtime's finalizer of its socket closes it, ending the session and
	// the lock with it, while the process still clones from the templates
	// (TestNewDatabaseHoldsTheTemplatesLock failed in CI that way).
	//lint:ignore U1000 written, never read: it is kept only to stay reachable
	templatesConn *pgx.Conn
)

// useTemplates takes, once per process, the shared lock that keeps
// DropTemplates from dropping the templates while this process may clone
// them. The session stays open until the process exits.
func useTemplates(serverURL string) error {
	templatesUseOnce.Do(func() {
		conn, err := pgx.Connect(context.Background(), serverURL)
		if err != nil {
			templatesUseErr = fmt.Errorf("pgtest: connecting to hold the templates' lock: %w", err)
			return
		}
		if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock_shared($1)`, templatesLockKey); err != nil {
			conn.Close(context.Background())
			templatesUseErr = fmt.Errorf("pgtest: taking the templates' lock: %w", err)
			return
		}
		// conn is deliberately never closed: the lock lasts as long as
		// the process.
		templatesConn = conn
	})
	return templatesUseErr
}

// DropTemplates drops the template databases of serverURL
// (testdb_tpl_<hash>) unless a test binary is using them, in which case it
// drops nothing and reports busy: that binary's run drops them when it
// ends. It returns the templates dropped and those left (none unless
// busy).
func DropTemplates(ctx context.Context, serverURL string) (dropped, left []string, busy bool, err error) {
	return dropTemplates(ctx, serverURL, templatesLockKey, templatePattern)
}

func dropTemplates(ctx context.Context, serverURL string, key int64, pattern string) (dropped, left []string, busy bool, err error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, nil, false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	list := func() ([]string, error) {
		rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datistemplate AND datname ~ $1 ORDER BY datname`, pattern)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	}
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&locked); err != nil {
		return nil, nil, false, err
	}
	if !locked {
		left, err = list()
		return nil, left, true, err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, key) //nolint:errcheck
	names, err := list()
	if err != nil {
		return nil, nil, false, err
	}
	for _, name := range names {
		ident := pgx.Identifier{name}.Sanitize()
		if _, err := conn.Exec(ctx, `ALTER DATABASE `+ident+` IS_TEMPLATE false`); err != nil {
			return dropped, nil, false, fmt.Errorf("unmarking template %s: %w", name, err)
		}
		if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+ident+` WITH (FORCE)`); err != nil {
			return dropped, nil, false, fmt.Errorf("dropping template %s: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	left, err = list()
	return dropped, left, false, err
}
