package redshift

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata/types"
	"github.com/aws/smithy-go"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/warehouse"
)

// dataAPI runs statements on the configured target through the Data API.
type dataAPI struct {
	cfg  Config
	data *redshiftdata.Client
}

// StatementError is a Data API statement (or batch) that ended FAILED or
// ABORTED. It is the one place where the Data API's error text is read:
// Transient is set for an aborted statement and for Redshift's
// serialization conflicts (ERROR: 1023 Serializable isolation violation, or
// a snapshot-isolation conflict with a concurrent transaction), and such an
// error wraps warehouse.ErrTransient.
type StatementError struct {
	ID        string
	Status    types.StatusString
	Message   string
	Transient bool
}

func (e *StatementError) Error() string {
	return fmt.Sprintf("redshift statement %s %s: %s", e.ID, e.Status, e.Message)
}

// Unwrap returns warehouse.ErrTransient for a transient failure.
func (e *StatementError) Unwrap() error {
	if e.Transient {
		return warehouse.ErrTransient
	}
	return nil
}

// serializationMarkers identify Redshift's serialization conflicts in a
// statement's error text (the Data API gives no error code).
var serializationMarkers = []string{
	"1023",                                 // ERROR: 1023 DETAIL: Serializable isolation violation on table …
	"serializable isolation violation",     // the same, as worded in the DETAIL
	"conflict with concurrent transaction", // snapshot isolation: … could not complete because of conflict with concurrent transaction
}

// interpretStatement turns a final DescribeStatement answer into nil
// (FINISHED) or a *StatementError.
func interpretStatement(d *redshiftdata.DescribeStatementOutput) error {
	if d.Status == types.StatusStringFinished {
		return nil
	}
	msg := aws.ToString(d.Error)
	if msg == "" {
		for _, sub := range d.SubStatements {
			if e := aws.ToString(sub.Error); e != "" {
				msg = e
				break
			}
		}
	}
	se := &StatementError{ID: aws.ToString(d.Id), Status: d.Status, Message: msg}
	if d.Status == types.StatusStringAborted {
		se.Transient = true
	}
	lower := strings.ToLower(msg)
	for _, m := range serializationMarkers {
		if strings.Contains(lower, m) {
			se.Transient = true
		}
	}
	return se
}

// errOutcomeUnknown is wrapped when a statement was not seen to end.
var errOutcomeUnknown = errors.New("statement outcome not known")

// target returns the Data API's target and authentication parameters.
func (w *dataAPI) target() (workgroup, cluster, database, secret, user *string) {
	opt := func(s string) *string {
		if s == "" {
			return nil
		}
		return aws.String(s)
	}
	return opt(w.cfg.WorkgroupName), opt(w.cfg.ClusterID), aws.String(w.cfg.Database), opt(w.cfg.SecretARN), opt(w.cfg.DBUser)
}

// params builds Data API parameters from name/value pairs.
func params(kv ...string) []types.SqlParameter {
	out := make([]types.SqlParameter, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, types.SqlParameter{Name: aws.String(kv[i]), Value: aws.String(kv[i+1])})
	}
	return out
}

// submitBatch submits sqls as one transaction and returns its id. token is
// the submission's ClientToken: the same token and request return the
// statement already submitted instead of running another. Empty, the SDK
// fills in one of its own, so its own retries of the request cannot run
// the transaction twice. p is for tests only: the warehouse writes values
// as literals (see sql.go).
func (w *dataAPI) submitBatch(ctx context.Context, name string, sqls []string, p []types.SqlParameter, token string) (string, error) {
	wg, cl, db, secret, user := w.target()
	var tok *string
	if token != "" {
		tok = aws.String(token)
	}
	out, err := w.data.BatchExecuteStatement(ctx, &redshiftdata.BatchExecuteStatementInput{
		Sqls: sqls, Parameters: p, StatementName: aws.String(name), ClientToken: tok,
		WorkgroupName: wg, ClusterIdentifier: cl, Database: db, SecretArn: secret, DbUser: user,
	})
	if err != nil {
		return "", fmt.Errorf("submitting %s: %w", name, err)
	}
	return aws.ToString(out.Id), nil
}

// submit submits one statement and returns its id.
func (w *dataAPI) submit(ctx context.Context, name, sql string, p []types.SqlParameter) (string, error) {
	wg, cl, db, secret, user := w.target()
	out, err := w.data.ExecuteStatement(ctx, &redshiftdata.ExecuteStatementInput{
		Sql: aws.String(sql), Parameters: p, StatementName: aws.String(name),
		WorkgroupName: wg, ClusterIdentifier: cl, Database: db, SecretArn: secret, DbUser: user,
	})
	if err != nil {
		return "", fmt.Errorf("submitting %s: %w", name, err)
	}
	return aws.ToString(out.Id), nil
}

// beforeCommitError is the caller's beforeCommit (or the journal) refusing
// a transaction run was about to submit: nothing was submitted.
type beforeCommitError struct{ err error }

func (e *beforeCommitError) Error() string { return e.err.Error() }
func (e *beforeCommitError) Unwrap() error { return e.err }

// submission is one transaction the warehouse submits and awaits.
type submission struct {
	// kind names the transaction in the Journal and its ClientToken;
	// empty for transactions that are neither recorded nor followed.
	kind string
	name string
	sqls []string
	// slice gives the batch and generation of the token and record;
	// records is recorded for a load.
	slice   warehouse.Slice
	records int64
	// timeout bounds the wait for the transaction to end; poll and
	// pollMax shape DescribeStatement polling.
	timeout, poll, pollMax time.Duration
	// before, if set, runs before each submission (a lease check).
	before func(context.Context) error
	// journal, if set, records the submission before and its id after it
	// is submitted, before it is awaited, and clears the record once the
	// transaction is seen to end.
	journal warehouse.Journal
}

// clientToken is the idempotency token of a submission: the same kind,
// batch, generation and attempt always give the same token, so a
// submission repeated (by the SDK, by submitIdempotent, or by a later
// delivery that found only the submission recorded) returns the statement
// already running instead of starting another. The batch's uid is part of
// it (a legacy batch, without one, keeps the token of builds before
// uids): a batch handed the id of a batch the operational database forgot
// is never answered with the forgotten batch's statement.
func clientToken(kind string, batch batch.Ref, generation int64, attempt int) string {
	name := fmt.Sprintf("%s/%d/%d/%d", kind, batch.ID, generation, attempt)
	if batch.UID != "" {
		name += "/" + batch.UID
	}
	h := sha256.Sum256([]byte(name))
	return "fleet-" + hex.EncodeToString(h[:16])
}

// run submits sub's transaction and awaits it. A transient failure (a
// serialization or snapshot-isolation conflict, an aborted statement) is
// submitted again after a backoff, up to ConflictRetries times. It returns
// the id of the last submission and nil once one FINISHED; a
// *StatementError for one that failed; an error wrapping errOutcomeUnknown
// (and warehouse.ErrTransient) when the last submission was not seen to end
// or its submission's answer never came; a *beforeCommitError when nothing
// was submitted; or, when ctx ended while a statement ran, ctx's cause,
// after cancelling the statement.
func (w *dataAPI) run(ctx context.Context, sub submission) (string, error) {
	backoff := w.cfg.RetryBackoff
	for attempt := 0; ; attempt++ {
		if sub.before != nil {
			if err := sub.before(ctx); err != nil {
				return "", &beforeCommitError{err}
			}
		}
		rec := warehouse.Statement{Kind: sub.kind, Generation: sub.slice.Generation, Attempt: attempt, Records: sub.records}
		if sub.journal != nil {
			if err := sub.journal.Record(ctx, rec); err != nil {
				return "", &beforeCommitError{fmt.Errorf("recording the submission of %s: %w", sub.name, err)}
			}
		}
		token := ""
		if sub.kind != "" {
			token = clientToken(sub.kind, sub.slice.Ref(), sub.slice.Generation, attempt)
		}
		id, err := w.submitIdempotent(ctx, sub.name, sub.sqls, token, sub.timeout)
		if err != nil {
			if ctx.Err() != nil {
				return "", fmt.Errorf("%s: %w", sub.name, context.Cause(ctx))
			}
			// The submission may have been accepted even so; a later
			// delivery repeats it with the recorded token to learn.
			return "", fmt.Errorf("%w: %w: %w", warehouse.ErrTransient, errOutcomeUnknown, err)
		}
		if sub.journal != nil {
			rec.ID = id
			if err := sub.journal.Record(ctx, rec); err != nil {
				// Unrecorded, a later delivery could not follow it: stop it.
				w.cancel(id)
				return id, fmt.Errorf("%w: statement %s submitted but not recorded: %w", errOutcomeUnknown, id, err)
			}
		}
		d, err := w.await(ctx, id, sub.timeout, sub.poll, sub.pollMax)
		if err != nil {
			if ctx.Err() != nil {
				w.cancel(id)
			}
			return id, err
		}
		if sub.journal != nil {
			if err := sub.journal.Record(ctx, warehouse.Statement{}); err != nil && ctx.Err() == nil {
				w.cfg.Logger.Warn("clearing the record of an ended statement", "statement_id", id, "error", err)
			}
		}
		err = interpretStatement(d)
		var se *StatementError
		if err == nil || !errors.As(err, &se) || !se.Transient || attempt >= w.cfg.ConflictRetries {
			return id, err
		}
		w.cfg.Logger.Info("redshift transaction conflicted: retrying", "statement", sub.name, "statement_id", id, "attempt", attempt+1, "backoff_seconds", backoff.Seconds(), "error", se.Message)
		select {
		case <-ctx.Done():
			return id, fmt.Errorf("%s: %w", sub.name, context.Cause(ctx))
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, w.cfg.RetryBackoffMax)
	}
}

// submitIdempotent submits with token, and, when a token makes it safe,
// submits again after a failure the Data API may not repeat (throttling,
// too many active statements, a lost answer) until timeout passes: the
// same token returns the statement if an earlier try was accepted.
func (w *dataAPI) submitIdempotent(ctx context.Context, name string, sqls []string, token string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	backoff := w.cfg.PollInterval
	for {
		id, err := w.submitBatch(ctx, name, sqls, nil, token)
		if err == nil || token == "" || ctx.Err() != nil || !retryableAPIError(err) || !time.Now().Add(backoff).Before(deadline) {
			return id, err
		}
		w.cfg.Logger.Info("submitting again with the same client token", "statement", name, "backoff_seconds", backoff.Seconds(), "error", err)
		select {
		case <-ctx.Done():
			return "", context.Cause(ctx)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, w.cfg.PollMax)
	}
}

// refusals are the Data API's answers that asking again cannot change.
var refusals = map[string]bool{
	"ValidationException":            true,
	"ResourceNotFoundException":      true,
	"AccessDeniedException":          true,
	"ExecuteStatementException":      true,
	"BatchExecuteStatementException": true,
	"QueryTimeoutException":          true,
}

// retryableAPIError reports whether a Data API request may succeed if
// asked again: everything but its refusals (throttling, too many active
// statements, internal errors, connection failures).
func retryableAPIError(err error) bool {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return !refusals[apiErr.ErrorCode()]
	}
	return true
}

// await polls the statement until it ends (FINISHED, FAILED or ABORTED)
// and returns its description. Polling starts at interval and backs off to
// maxInterval; a DescribeStatement request that fails (throttling, an
// internal error, a lost connection) is asked again on the same schedule.
// When timeout passes first it returns an error wrapping
// warehouse.ErrTransient and errOutcomeUnknown; when ctx ends first, ctx's
// error. Neither means the statement failed: it may still commit, and only
// the stamp tells.
func (w *dataAPI) await(ctx context.Context, id string, timeout, interval, maxInterval time.Duration) (*redshiftdata.DescribeStatementOutput, error) {
	deadline := time.Now().Add(timeout)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	var (
		status  types.StatusString = "unknown"
		lastErr error
	)
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("statement %s: %w", id, context.Cause(ctx))
		case <-timer.C:
		}
		d, err := w.data.DescribeStatement(ctx, &redshiftdata.DescribeStatementInput{Id: aws.String(id)})
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, fmt.Errorf("statement %s: %w", id, context.Cause(ctx))
		case err != nil && !retryableAPIError(err):
			return nil, fmt.Errorf("%w: %w: describing statement %s: %w", warehouse.ErrTransient, errOutcomeUnknown, id, err)
		case err != nil:
			lastErr = err
		default:
			switch d.Status {
			case types.StatusStringFinished, types.StatusStringFailed, types.StatusStringAborted:
				return d, nil
			}
			status, lastErr = d.Status, nil
		}
		if !time.Now().Before(deadline) {
			if lastErr != nil {
				return nil, fmt.Errorf("%w: %w: statement %s not described within %s: %w", warehouse.ErrTransient, errOutcomeUnknown, id, timeout, lastErr)
			}
			return nil, fmt.Errorf("%w: %w: statement %s still %s after %s", warehouse.ErrTransient, errOutcomeUnknown, id, status, timeout)
		}
		interval = min(interval*3/2, maxInterval)
		timer.Reset(min(interval, time.Until(deadline)+time.Millisecond))
	}
}

// cancel asks the Data API to stop a statement that is still running, for a
// delivery that lost its lease or is shutting down. It is best effort: the
// statement may have committed already, which only the stamp tells.
func (w *dataAPI) cancel(id string) {
	ctx, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	if _, err := w.data.CancelStatement(ctx, &redshiftdata.CancelStatementInput{Id: aws.String(id)}); err != nil {
		w.cfg.Logger.Warn("cancelling redshift statement", "statement_id", id, "error", err)
	}
}

// query runs one read statement and returns its rows.
func (w *dataAPI) query(ctx context.Context, name, sql string) ([][]types.Field, error) {
	return w.queryParams(ctx, name, sql, nil)
}

// queryParams is query with parameters, for tests (a SELECT, where the Data
// API documents them).
func (w *dataAPI) queryParams(ctx context.Context, name, sql string, p []types.SqlParameter) ([][]types.Field, error) {
	ctx, done := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer done()
	id, err := w.submit(ctx, name, sql, p)
	if err != nil {
		return nil, err
	}
	d, err := w.await(ctx, id, w.cfg.QueryTimeout, w.cfg.PollInterval, w.cfg.PollMax)
	if err != nil {
		return nil, err
	}
	if err := interpretStatement(d); err != nil {
		return nil, err
	}
	var rows [][]types.Field
	var token *string
	for {
		out, err := w.data.GetStatementResult(ctx, &redshiftdata.GetStatementResultInput{Id: aws.String(id), NextToken: token})
		if err != nil {
			return nil, fmt.Errorf("reading result of %s: %w", name, err)
		}
		rows = append(rows, out.Records...)
		if token = out.NextToken; aws.ToString(token) == "" {
			return rows, nil
		}
	}
}

// Field readers. The Data API answers BIGINT as longValue, TIMESTAMP as a
// string, and NULL as isNull.

func fieldInt(f types.Field) (int64, error) {
	switch v := f.(type) {
	case *types.FieldMemberLongValue:
		return v.Value, nil
	case *types.FieldMemberIsNull:
		return 0, errors.New("unexpected NULL")
	}
	return 0, fmt.Errorf("unexpected field %T", f)
}

// timestampLayouts are the forms of a TIMESTAMP value in a Data API result.
var timestampLayouts = []string{"2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07", "2006-01-02 15:04:05.999999999Z07:00"}

func fieldTime(f types.Field) (*time.Time, error) {
	switch v := f.(type) {
	case *types.FieldMemberIsNull:
		return nil, nil
	case *types.FieldMemberStringValue:
		for _, layout := range timestampLayouts {
			if t, err := time.Parse(layout, v.Value); err == nil {
				t = t.UTC()
				return &t, nil
			}
		}
		return nil, fmt.Errorf("unparsable timestamp %q", v.Value)
	}
	return nil, fmt.Errorf("unexpected field %T", f)
}
