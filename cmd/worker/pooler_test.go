package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/warehouse/warehousecli"
)

// TestConnectionBudget: the default --max-conns is min(concurrency/2, 8) + 4, and
// the pools it is split into add up to it: one renewal connection, River's
// LISTEN connection unless River polls, the PostgreSQL warehouse's loads
// (none with Redshift) and the shared rest.
func TestConnectionBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		concurrency, maxConns int
		redshift, pollOnly    bool
		want                  connBudget
	}{
		{concurrency: 4, want: connBudget{Renewals: 1, Listener: 1, Loads: 2, Shared: 2}},
		{concurrency: 4, pollOnly: true, want: connBudget{Renewals: 1, Loads: 2, Shared: 3}},
		{concurrency: 16, want: connBudget{Renewals: 1, Listener: 1, Loads: 8, Shared: 2}},
		{concurrency: 32, want: connBudget{Renewals: 1, Listener: 1, Loads: 8, Shared: 2}},
		{concurrency: 32, redshift: true, want: connBudget{Renewals: 1, Listener: 1, Shared: 10}},
		{concurrency: 32, redshift: true, pollOnly: true, want: connBudget{Renewals: 1, Shared: 11}},
		{concurrency: 1, want: connBudget{Renewals: 1, Listener: 1, Loads: 1, Shared: 1}},
		{concurrency: 8, maxConns: 40, want: connBudget{Renewals: 1, Listener: 1, Loads: 8, Shared: 30}},
		{concurrency: 8, maxConns: 4, pollOnly: true, want: connBudget{Renewals: 1, Loads: 1, Shared: 2}},
	} {
		r := runCmd{Concurrency: tc.concurrency, MaxConns: tc.maxConns}
		if tc.redshift {
			r.Flags = warehousecli.Flags{Warehouse: warehousecli.KindRedshift}
		}
		got := r.budget(tc.pollOnly)
		require.Equal(t, tc.want, got, "%+v", tc)
		wantTotal := tc.maxConns
		if wantTotal == 0 {
			wantTotal = min(tc.concurrency/2, 8) + 4
		}
		require.Equal(t, int32(wantTotal), got.Total(), "%+v", tc)
	}
}

// TestPoolerSetting: --database-pooler (DATABASE_POOLER) takes none or
// transaction; anything else, and --max-conns below 4, are invalid input;
// worker migrate refuses transaction with exit 2 before it connects.
func TestPoolerSetting(t *testing.T) {
	t.Parallel()
	unreachable := "postgres://nobody@127.0.0.1:1/none"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--database-url", unreachable, "--database-pooler", "session"}, "database_pooler"},
		{[]string{"run", "--database-url", unreachable, "--max-conns", "3"}, "--max-conns (3) must be at least 4"},
		{[]string{"migrate", "--database-url", unreachable, "--database-pooler", "transaction"}, "worker migrate needs a direct connection"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, "%v: %s", tc.args, stderr.String())
		require.Contains(t, stderr.String(), tc.want, tc.args)
	}
	var stdout, stderr bytes.Buffer
	require.Equal(t, cli.ExitOK, run(context.Background(), []string{"run", "--help"}, &stdout, &stderr))
	require.Contains(t, stdout.String(), "$DATABASE_POOLER")
}
