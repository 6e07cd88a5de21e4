package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/ingest/internal/batch"
)

// Term is one entry of a batch's lease trail (column execution_lease_terms):
// one acquisition of the execution lease, written by the statements that
// acquire, release and end leases, never by renewals.
type Term struct {
	LeaseID    string    `json:"leaseId"`
	Generation int64     `json:"generation"`
	At         time.Time `json:"at"`
	// ExpiresAt is the term's expiry: the initial one while the term is
	// open (the live expiry is then the row's execution_lease_expires_at),
	// the final one once Closed.
	ExpiresAt time.Time `json:"expiresAt"`
	// ReleasedAt is set when the holder released the lease, or a terminal
	// fenced write ended it, rather than letting it expire.
	ReleasedAt *time.Time `json:"releasedAt,omitempty"`
	// Closed is true once the term ended: released, ended by a terminal
	// write, or taken over after it expired.
	Closed bool `json:"closed"`
	// Phase is the phase the acquisition that opened the term recorded in
	// the batch's details (Start), if any.
	Phase batch.Phase `json:"phase,omitempty"`
}

// End is when a closed term stopped holding the lease: its release, or its
// final expiry, whichever came first.
func (t Term) End() time.Time {
	if t.ReleasedAt != nil && t.ReleasedAt.Before(t.ExpiresAt) {
		return *t.ReleasedAt
	}
	return t.ExpiresAt
}

// ParseTerms decodes a lease trail.
func ParseTerms(raw []byte) ([]Term, error) {
	var terms []Term
	if err := json.Unmarshal(raw, &terms); err != nil {
		return nil, fmt.Errorf("lease trail: %w", err)
	}
	return terms, nil
}

// Trail is a batch's lease trail with the row's current lease, which is
// the live end of an open last term.
type Trail struct {
	Terms []Term
	// Generation and ExpiresAt are the row's current generation and lease
	// expiry (nil when no lease is held).
	Generation int64
	ExpiresAt  *time.Time
}

// Trail reads the lease trail of a batch, oldest term first. It returns
// batch.ErrNotFound when no batch has the id.
func (s *Store) Trail(ctx context.Context, batchID int64) (Trail, error) {
	var (
		t   Trail
		raw []byte
	)
	err := s.db.QueryRow(ctx, `
		SELECT execution_lease_terms, execution_lease_generation, execution_lease_expires_at
		FROM ingestion_batches WHERE id = $1`, batchID).Scan(&raw, &t.Generation, &t.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Trail{}, batch.ErrNotFound
	}
	if err != nil {
		return Trail{}, fmt.Errorf("reading lease trail of batch %d: %w", batchID, err)
	}
	if t.Terms, err = ParseTerms(raw); err != nil {
		return Trail{}, err
	}
	return t, nil
}
