package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/testkit/pgtest"
	"github.com/fleet/ingest/internal/uploads"
)

// TestTokenOperatorMintsANamedToken: enqueue token operator --name prints a
// token and the line of the operator tokens file that names it, which the
// door reads as that operator's; a name the file could not hold is
// invalid input.
func TestTokenOperatorMintsANamedToken(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"token", "operator", "--name", "alice"}, &out, &errOut)
	require.Equal(t, cli.ExitOK, code, errOut.String())
	var minted map[string]string
	require.NoError(t, json.Unmarshal(out.Bytes(), &minted))
	require.Equal(t, "minted", minted["outcome"])
	require.Equal(t, "alice", minted["operator"])
	require.True(t, strings.HasPrefix(minted["token"], uploads.OperatorTokenPrefix))
	require.NotContains(t, minted["line"], minted["token"], "the line holds the hash, never the token")
	tokens, errs, legacy := uploads.ParseOperatorTokens([]byte(minted["line"] + "\n"))
	require.Empty(t, errs)
	require.False(t, legacy)
	require.Len(t, tokens, 1)

	out.Reset()
	code = run(context.Background(), []string{"token", "operator", "--name", "two words"}, &out, &errOut)
	require.Equal(t, cli.ExitInvalidInput, code)
	require.Contains(t, out.String(), `"field":"name"`)
}

// TestRiverUIJobActionsAreRecorded: a job action the gate forwards to the
// River UI (here on jobs that are no ingest job's) is recorded in the
// operators' audit once River answered, as by the operator the token
// named, with the job ids and River's answer.
func TestRiverUIJobActionsAreRecorded(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	answer := http.StatusOK
	ui := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(answer) })
	gate := &uiActions{ui: ui, pool: pool, log: slog.New(slog.DiscardHandler)}
	for action, status := range map[string]int{"retry": http.StatusOK, "delete": http.StatusInternalServerError} {
		answer = status
		req := httptest.NewRequest(http.MethodPost, "/riverui/api/jobs/"+action, strings.NewReader(`{"ids":["901","902"]}`))
		req = req.WithContext(uploads.WithOperator(req.Context(), "alice"))
		req.SetBasicAuth("mallory", "x")
		rec := httptest.NewRecorder()
		gate.ServeHTTP(rec, req)
		require.Equal(t, status, rec.Code, "River's answer")
	}
	entries, err := audit.List(context.Background(), pool, audit.Filter{})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	byAction := map[string]audit.Entry{}
	for _, e := range entries {
		byAction[e.Action] = e
	}
	for _, want := range []struct{ action, outcome, details string }{
		{audit.ActionJobDelete, "failed", `{"job_ids":[901,902],"status":500}`},
		{audit.ActionJobRetry, "done", `{"job_ids":[901,902],"status":200}`},
	} {
		e := byAction[want.action]
		require.Equal(t, want.action, e.Action)
		require.Equal(t, want.outcome, e.Outcome)
		require.JSONEq(t, want.details, string(e.Details))
		require.Equal(t, "alice", e.Actor)
		require.Equal(t, audit.DoorRiverUI, e.Door)
		require.Equal(t, "says mallory; from 192.0.2.1", e.Note)
	}
}
