package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
// line naming who (--by, or cli:USER@HOST), what (the action, the batch,
// the tenant, the outcome and what it changed) and why (--reason), also
// when the action is refused; a retry's import writes no line of its own.
func TestEveryOperatorActionIsLoggedOnceWithWhoWhatWhy(t *testing.T) {
	// Not parallel: it sets ENQUEUE_OPERATOR.
	dbURL := pgtest.NewDatabaseURL(t)
	pool := pgtest.Pool(t, dbURL)
	running := phased(t, pool, "tenant-o", batch.PhaseLoading, batch.StatusRunning, time.Minute)
	failedPub := phased(t, pool, "tenant-p", batch.PhaseFailedPublication, batch.StatusFailed, 0)

	out, code, lines := operatorLines(t, dbURL, "cancel", "--batch-id", fmt.Sprint(running.ID), "--tenant-id", "tenant-o",
		"--by", "alice", "--reason", "wrong upload")
	require.Equal(t, cli.ExitOK, code, out)
	require.Len(t, lines, 1)
	l := lines[0]
	require.Equal(t, "cancel", l["action"])
	require.Equal(t, "alice", l["by"])
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
	require.Equal(t, "bob", l["by"], "ENQUEUE_OPERATOR names who")
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
	require.True(t, strings.HasPrefix(lines[0]["by"].(string), "bob"), "%v", lines[0]["by"])

	t.Setenv("ENQUEUE_OPERATOR", "")
	out, code, lines = operatorLines(t, dbURL, "resume", "--batch-id", fmt.Sprint(failedPub.ID), "--tenant-id", "tenant-p",
		"--reason", "publisher fixed")
	require.Equal(t, cli.ExitNotResumable, code, out) // no warehouse slice proves it: refused
	require.Len(t, lines, 1)
	l = lines[0]
	require.Equal(t, "resume", l["action"])
	require.Regexp(t, `^cli:[^@]+@`, l["by"], "by defaults to cli:USER@HOST")
	require.Equal(t, "publisher fixed", l["reason"])
	require.Equal(t, jobs.OutcomeNotResumable, l["outcome"])
	require.NotEmpty(t, l["refusal"])

	// Bad operator text is refused before anything is done.
	out, code, lines = operatorLines(t, dbURL, "retry", "--batch-id", fmt.Sprint(running.ID), "--tenant-id", "tenant-o",
		"--reason", "two\nlines")
	require.Equal(t, cli.ExitInvalidInput, code, out)
	require.Empty(t, lines)
}
