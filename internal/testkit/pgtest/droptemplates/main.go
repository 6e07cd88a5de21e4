// Command droptemplates drops the PostgreSQL template databases the tests
// cloned their databases from (pgtest.DropTemplates), unless a test binary
// still uses them. make test runs it after the tests, so a run leaves no
// testdb_tpl_* template on the server. It exits 1 if templates remain
// although no test binary held them. Without TEST_DATABASE_URL (the tests
// ran in a container, removed with them) it does nothing.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func main() {
	url := os.Getenv(pgtest.EnvURL)
	if url == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dropped, left, busy, err := pgtest.DropTemplates(ctx, url)
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "droptemplates: %s: %v\n", cli.Redact(url), err)
		os.Exit(1)
	case busy:
		fmt.Printf("droptemplates: %d template database(s) left: another test run uses them and drops them when it ends\n", len(left))
	case len(left) > 0:
		fmt.Fprintf(os.Stderr, "droptemplates: template databases remain: %v\n", left)
		os.Exit(1)
	default:
		fmt.Printf("droptemplates: dropped %d template database(s); none left\n", len(dropped))
	}
}
