package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

// operatorLines runs the CLI with its logs captured and returns its
// operator action lines.
func operatorLines(t *testing.T, dbURL string, args ...string) (stdout string, code int, lines []map[string]any) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), append(args, "--database-url", dbURL, "--log-format", "json"), &out, &errOut)
	sc := bufio.NewScanner(&errOut)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == jobs.OperatorLog {
			lines = append(lines, m)
		}
	}
	return out.String(), code, lines
}

// TestEveryOperatorActionIsLoggedOnceWithWhoWhatWhy: cancel, retry and
// resume from the command line each write exactly one operator action
// line naming who (cli:<database login>: the credential), what the caller
// says of itself (--by and the OS user, in the note), what (the action,
// the batch, the tenant, the outcome and what it changed) and why
// (--reason), also when the action is refused; a retry's import writes no
// line of its own. Each is one row of the operators' audit too.
func TestEveryOperatorActionIsLoggedOnceWithWhoWhatWhy(t *testing.T) {
	// Not parallel: it sets ENQUEUE_OPERATOR.
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	running := phased(t, pool, "tenant-o", batch.PhaseLoading, batch.StatusRunning, time.Minute)
	failedPub := phased(t, pool, "tenant-p", batch.PhaseFailedPublication, batch.StatusFailed, 0)
	login, err := audit.CurrentLogin(context.Background(), pool)
	require.NoError(t, err)

	out, code, lines := operatorLines(t, dbURL, "cancel", "--batch-id", fmt.Sprint(running.ID), "--tenant-id", "tenant-o",
		"--by", "alice", "--reason", "wrong upload")
	require.Equal(t, cli.ExitOK, code, out)
	require.Len(t, lines, 1)
	l := lines[0]
	require.Equal(t, "cancel", l["action"])
	require.Equal(t, "cli:"+login, l["by"], "who is the database login")
	require.Contains(t, l["note"], "says alice", "--by is a note")
	require.Equal(t, "wrong upload", l["reason"])
	require.Equal(t, float64(running.ID), l["batch_id"])
	require.Equal(t, "tenant-o", l["tenant_id"])
	require.Equal(t, jobs.OutcomeCancelled, l["outcome"])
	require.Equal(t, "worker-1/job-7/attempt-1/ab12", l["previous_holder"])

	t.Setenv("ENQUEUE_OPERATOR", "bob")
	out, code, lines = operatorLines(t, dbURL, "retry", "--batch-id", fmt.Sprint(running.ID), "--tenant-id", "tenant-o",
		"--reason", "re-uploaded")
	require.Equal(t, cli.ExitOK, code, out)
	require.Len(t, lines, 1, "one line: the retry's import writes none of its own")
	l = lines[0]
	require.Equal(t, "retry", l["action"])
	require.Equal(t, "cli:"+login, l["by"])
	require.Contains(t, l["note"], "says bob", "ENQUEUE_OPERATOR is a note")
	require.Equal(t, "re-uploaded", l["reason"])
	require.Equal(t, jobs.OutcomeEnqueued, l["outcome"])
	require.NotZero(t, l["new_batch_id"])
	require.NotZero(t, l["job_id"])

	// Refused actions are logged too, with the refusal.
	out, code, lines = operatorLines(t, dbURL, "retry", "--batch-id", fmt.Sprint(failedPub.ID), "--tenant-id", "tenant-p")
	require.NotEqual(t, cli.ExitOK, code, out)
	require.Len(t, lines, 1)
	require.Equal(t, jobs.OutcomeNotRetryable, lines[0]["outcome"])
	require.Equal(t, jobs.ReasonResumeInstead, lines[0]["refusal"])
	require.Equal(t, "cli:"+login, lines[0]["by"])
	require.Contains(t, lines[0]["note"], "says bob")

	t.Setenv("ENQUEUE_OPERATOR", "")
	out, code, lines = operatorLines(t, dbURL, "resume", "--batch-id", fmt.Sprint(failedPub.ID), "--tenant-id", "tenant-p",
		"--reason", "publisher fixed")
	require.Equal(t, cli.ExitNotResumable, code, out) // no warehouse slice proves it: refused
	require.Len(t, lines, 1)
	l = lines[0]
	require.Equal(t, "resume", l["action"])
	require.Equal(t, "cli:"+login, l["by"])
	require.Regexp(t, `^os user [^@]+@`, l["note"], "the note names the OS user and host")
	require.Equal(t, "publisher fixed", l["reason"])
	require.Equal(t, jobs.OutcomeNotResumable, l["outcome"])
	require.NotEmpty(t, l["refusal"])

	// Bad operator text is refused before anything is done.
	out, code, lines = operatorLines(t, dbURL, "retry", "--batch-id", fmt.Sprint(running.ID), "--tenant-id", "tenant-o",
		"--reason", "two\nlines")
	require.Equal(t, cli.ExitInvalidInput, code, out)
	require.Empty(t, lines)

	// The audit holds the same four actions, newest first.
	entries, err := audit.List(context.Background(), pool, audit.Filter{})
	require.NoError(t, err)
	var got []string
	for _, e := range entries {
		require.Equal(t, login, e.Actor)
		require.Equal(t, audit.DoorCLI, e.Door)
		got = append(got, e.Action+":"+e.Outcome)
	}
	require.Equal(t, []string{"resume:not_resumable", "retry:not_retryable", "retry:enqueued", "cancel:cancelled"}, got)
}
