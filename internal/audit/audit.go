// Package audit is the operators' audit: every operator action (a cancel,
// a retry, a resume, a prune, a River UI job action, a queue paused or
// resumed) is one row of ingest_operator_actions (migration 00110) saying
// who, what, when and why, and enqueue audit reads them.
//
// Who is the credential's, never the caller's word: the name an operator
// token carries (enqueue serve's --operator-token-file, for the cancel route
// and the River UI), or the database login of a command (enqueue cancel,
// retry, resume, prune). What a caller says of itself (enqueue --by, the OS
// user, the X-Fleet-Operator header, the River UI's Basic user name, the
// client's address) is kept as a free-text note. The database adds the
// login that wrote the row and the time (its clock); no runtime role may
// write either, nor change or delete a row (deploy/postgres/roles.sql and
// the migration's trigger): the audit is append-only.
//
// A row is written in the action's own transaction where the action is a
// transaction of ours (Record with the transaction), so the audit and the
// change commit or roll back together.
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Doors an operator action comes through.
const (
	DoorCLI     = "cli"
	DoorHTTP    = "http"
	DoorRiverUI = "riverui"
)

// Actions recorded.
const (
	ActionCancel      = "cancel"
	ActionRetry       = "retry"
	ActionResume      = "resume"
	ActionPrune       = "prune"
	ActionJobCancel   = "job_cancel"
	ActionJobRetry    = "job_retry"
	ActionJobDelete   = "job_delete"
	ActionQueuePause  = "queue_pause"
	ActionQueueResume = "queue_resume"
)

// Bounds of the text columns (the table's CHECK constraints).
const (
	maxActor  = 200
	maxReason = 500
	maxNote   = 500
)

// Actor is who acts, and through which door.
type Actor struct {
	// Name is who, from the credential: the operator token's name, or the
	// command's database login.
	Name string
	// Door is DoorCLI, DoorHTTP or DoorRiverUI.
	Door string
	// Note is what the caller says of itself (a name it asserts, its
	// address): recorded as free text, never as Name.
	Note string
}

// By is how the actor is named in a log line and in a cancel's
// cancelled_by: "<door>:<name>".
func (a Actor) By() string {
	return nonEmpty(a.Door, "unknown") + ":" + nonEmpty(a.Name, "unnamed")
}

// Entry is one operator action.
type Entry struct {
	ID int64 `json:"id"`
	// At is when it was recorded, by the database clock (the start of the
	// action's transaction).
	At time.Time `json:"at"`
	// Actor is who, from the credential; Login the database login that
	// wrote the row.
	Actor string `json:"actor"`
	Login string `json:"login"`
	Door  string `json:"door"`
	// Action is what (ActionCancel…), Outcome its answer.
	Action   string `json:"action"`
	Outcome  string `json:"outcome"`
	BatchID  int64  `json:"batch_id,omitempty"`
	TenantID string `json:"tenant_id,omitempty"`
	Queue    string `json:"queue,omitempty"`
	// Reason is why (the operator's --reason, a route's reason).
	Reason string `json:"reason,omitempty"`
	// Note is what the caller said of itself.
	Note string `json:"note,omitempty"`
	// Details is the action's answer (JSON object).
	Details json.RawMessage `json:"details,omitempty"`
}

// Execer is what Record needs: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier is what List needs.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Action is what Record writes: who (Actor), what and why.
type Action struct {
	Actor    Actor
	Action   string
	Outcome  string
	BatchID  int64
	TenantID string
	Queue    string
	Reason   string
	// Details is marshalled to JSON (an object); nil is {}.
	Details any
}

// Record writes a as one row through db (the action's transaction, where
// there is one). Texts over their column's bound are cut (at a rune
// boundary, marked "…"), so a long reason never fails the action. An
// actor without a name is recorded as the database login (current_user).
func Record(ctx context.Context, db Execer, a Action) error {
	details := []byte("{}")
	if a.Details != nil {
		b, err := json.Marshal(a.Details)
		if err != nil {
			return fmt.Errorf("audit: details: %w", err)
		}
		details = b
	}
	var batchID *int64
	if a.BatchID != 0 {
		batchID = &a.BatchID
	}
	_, err := db.Exec(ctx, `
		INSERT INTO ingest_operator_actions (actor, door, action, outcome, batch_id, tenant_id, queue, reason, note, details)
		VALUES (coalesce(nullif($1, ''), current_user), $2, $3, $4, $5, nullif($6, ''), nullif($7, ''), $8, $9, $10::jsonb)`,
		cut(a.Actor.Name, maxActor), nonEmpty(a.Actor.Door, "unknown"), a.Action, cut(a.Outcome, 60), batchID,
		cut(a.TenantID, 200), cut(a.Queue, 200), cut(a.Reason, maxReason), cut(a.Actor.Note, maxNote), string(details))
	if err != nil {
		return fmt.Errorf("audit: recording %s: %w", a.Action, err)
	}
	return nil
}

// Filter selects the entries List returns.
type Filter struct {
	// Since, if not zero, keeps the entries recorded at or after it.
	Since time.Time
	// Limit is the most entries returned, newest first. Defaults to
	// LimitDefault.
	Limit int
}

// LimitDefault is Filter.Limit's default.
const LimitDefault = 100

// List returns the entries f selects, newest first.
func List(ctx context.Context, db Querier, f Filter) ([]Entry, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = LimitDefault
	}
	var since *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	rows, err := db.Query(ctx, `
		SELECT id, at, actor, login, door, action, outcome, coalesce(batch_id, 0), coalesce(tenant_id, ''),
		       coalesce(queue, ''), reason, note, details::text
		FROM ingest_operator_actions
		WHERE $1::timestamptz IS NULL OR at >= $1
		ORDER BY at DESC, id DESC
		LIMIT $2`, since, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var e Entry
		var details string
		err := r.Scan(&e.ID, &e.At, &e.Actor, &e.Login, &e.Door, &e.Action, &e.Outcome, &e.BatchID, &e.TenantID,
			&e.Queue, &e.Reason, &e.Note, &details)
		if details != "{}" {
			e.Details = json.RawMessage(details)
		}
		return e, err
	})
}

// CurrentLogin is the database login of db's session (current_user): the
// actor of a command's actions.
func CurrentLogin(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (string, error) {
	var login string
	err := db.QueryRow(ctx, `SELECT current_user`).Scan(&login)
	return login, err
}

// Notes joins the parts of a note that are not empty with "; ".
func Notes(parts ...string) string {
	var kept []string
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, "; ")
}

func nonEmpty(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// cut bounds s to n bytes, at a rune boundary, marking a cut with "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-len("…")]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
