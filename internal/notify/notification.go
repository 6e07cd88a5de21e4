package notify

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleet/ingest/internal/batch"
)

// Outcome is how a batch ended, as its notification says.
type Outcome string

// The outcomes a batch is notified of.
const (
	OutcomeSucceeded Outcome = "succeeded"
	OutcomeFailed    Outcome = "failed"
	// OutcomeParked: the batch waits for an operator (this build cannot
	// work on it).
	OutcomeParked Outcome = "parked"
)

// Outcomes are the known outcomes.
var Outcomes = []Outcome{OutcomeSucceeded, OutcomeFailed, OutcomeParked}

// Valid reports whether o is a known outcome.
func (o Outcome) Valid() bool {
	for _, k := range Outcomes {
		if o == k {
			return true
		}
	}
	return false
}

// Event is the event name of an outcome: "batch.<outcome>" (the
// X-Fleet-Event header).
func (o Outcome) Event() string { return "batch." + string(o) }

// Notification is what a tenant is told of a batch's outcome: the body of a
// webhook's POST and of an SNS message.
type Notification struct {
	// IdempotencyKey is the same on every attempt to send this
	// notification (Key); receivers drop repeats by it.
	IdempotencyKey string  `json:"idempotency_key"`
	Outcome        Outcome `json:"outcome"`
	BatchID        int64   `json:"batch_id"`
	// BatchUID is the batch's random identity (absent for a batch written
	// before uids existed). Unlike the id it never repeats, even after the
	// coordinator's database was restored from a backup or failed over to
	// a standby that was behind.
	BatchUID string `json:"batch_uid,omitempty"`
	TenantID string `json:"tenant_id"`
	Folder   string `json:"folder,omitempty"`
	// Status is the batch's status (Succeeded, Failed, Running for a
	// parked batch).
	Status string `json:"status"`
	// Phase and Reason say more of a failure or a parking (the batch's
	// phase and failure reason).
	Phase   string `json:"phase,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// At is when the outcome was written.
	At time.Time `json:"at"`
}

// Key is the idempotency key of the notification of a batch's outcome:
// "batch-<batch uid>-<outcome>-<generation>", e.g.
// "batch-6f1c0e52-7f0a-4c1e-9a57-2d7b8c1e0f44-failed-3". The generation is
// the execution lease's generation of the term that wrote the outcome: a
// resumed batch may fail twice (or be parked twice), and each is a
// notification of its own, while every attempt to send one of them carries
// the same key. The uid, not the id, names the batch: ids are handed out
// again after the coordinator's database went back in time (a restore, a
// failover to a standby that was behind), uids never, so a receiver that
// drops repeats by key never drops a new batch's outcome. A batch written
// before uids existed keeps the key of its id, "batch-42-failed-3".
func Key(b batch.Ref, outcome Outcome, generation int64) string {
	if b.UID == "" {
		return fmt.Sprintf("batch-%d-%s-%d", b.ID, outcome, generation)
	}
	return fmt.Sprintf("batch-%s-%s-%d", b.UID, outcome, generation)
}

// Validate checks what a receiver relies on: a key, a known outcome, a
// batch id and a valid tenant id.
func (n Notification) Validate() error {
	switch {
	case n.IdempotencyKey == "":
		return errors.New("notification: no idempotency key")
	case !n.Outcome.Valid():
		return fmt.Errorf("notification: unknown outcome %q", n.Outcome)
	case n.BatchID <= 0:
		return fmt.Errorf("notification: batch id %d", n.BatchID)
	}
	if err := batch.ValidateTenantID(n.TenantID); err != nil {
		return fmt.Errorf("notification: %w", err)
	}
	return nil
}

// Body is the notification as sent: its JSON, At in UTC.
func (n Notification) Body() ([]byte, error) {
	n.At = n.At.UTC()
	return json.Marshal(n)
}
