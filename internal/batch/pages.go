package batch

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PageFilter selects a page of one tenant's scoped batches, newest first
// by reservation time (started_at, then id): Page.
type PageFilter struct {
	TenantID string
	// SourceScope, if set, keeps one folder's batches.
	SourceScope string
	// Status, if set, keeps batches in it.
	Status Status
	// Since and Until, if not zero, keep batches reserved at or after
	// Since and before Until.
	Since, Until time.Time
	// After continues after the last batch of an earlier page (its
	// Cursor); nil: the first page.
	After *Cursor
	// Limit is the page's size, 1 to MaxPageSize; 0: DefaultPageSize.
	Limit int
	// Newest, if set, keeps only the newest batch of each folder (no
	// later batch of its tenant and source scope: the highest id, as
	// Latest); with Status Failed, the folders whose newest batch failed.
	Newest bool
}

// Page sizes.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Cursor is where a page ended: the reservation time and id of its last
// batch. Pages follow (started_at, id) downwards, a total order, so a
// batch is on one page at most however many are reserved meanwhile, and
// every batch whose reservation committed before the first page was read
// (and that matches the filter throughout) is on exactly one. started_at
// is the start of the reserving transaction, which may commit later: a
// batch that commits after the first page was read is on a later page
// only if it sorts after the cursor of the page read before it committed;
// otherwise — a newer batch, which sorts before the first page, or an
// older one whose transaction committed late — it is on no page of the
// walk (README, "Reading batches": walk again to see it).
type Cursor struct {
	StartedAt time.Time
	ID        int64
}

// ErrBadCursor is returned by ParseCursor for text no page gave out.
var ErrBadCursor = errors.New("not a cursor of this listing")

// String encodes the cursor as an opaque token.
func (c Cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.StartedAt.UnixMicro(), 10) + "." + strconv.FormatInt(c.ID, 10)))
}

// ParseCursor decodes a cursor's token.
func ParseCursor(s string) (Cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, ErrBadCursor
	}
	at, id, ok := strings.Cut(string(raw), ".")
	micros, err1 := strconv.ParseInt(at, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil || n <= 0 {
		return Cursor{}, ErrBadCursor
	}
	return Cursor{StartedAt: time.UnixMicro(micros).UTC(), ID: n}, nil
}

// Page returns a page of the tenant's scoped batches matching f, newest
// first, and the cursor of the next page (nil on the last). It reads from
// ix_ingestion_batches_tenant_started, or ix_ingestion_batches_scope for
// one folder.
func (s *Store) Page(ctx context.Context, f PageFilter) ([]Batch, *Cursor, error) {
	if f.TenantID == "" {
		return nil, nil, errors.New("a page names its tenant")
	}
	query, args, limit := pageQuery(f)
	rows, err := s.db.Query(ctx, query, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var out []Batch
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if len(out) <= limit {
		return out, nil, nil
	}
	out = out[:limit]
	last := out[len(out)-1]
	return out, &Cursor{StartedAt: last.StartedAt, ID: last.ID}, nil
}

// pageQuery is Page's statement for f, naming only the predicates f sets
// (so each shape gets the plan of its index), its arguments and the page
// size; it asks for one row more than the page, to know whether another
// follows.
func pageQuery(f PageFilter) (string, []any, int) {
	if f.Limit <= 0 {
		f.Limit = DefaultPageSize
	}
	f.Limit = min(f.Limit, MaxPageSize)
	where := []string{"tenant_id = $1", "source_scope IS NOT NULL"}
	args := []any{f.TenantID}
	add := func(cond string, v ...any) {
		for i := range v {
			cond = strings.Replace(cond, "$?", "$"+strconv.Itoa(len(args)+i+1), 1)
		}
		where = append(where, cond)
		args = append(args, v...)
	}
	if f.SourceScope != "" {
		add("source_scope = $?", f.SourceScope)
	}
	if f.Status != "" {
		add("status = $?", string(f.Status))
	}
	if !f.Since.IsZero() {
		add("started_at >= $?", f.Since)
	}
	if !f.Until.IsZero() {
		add("started_at < $?", f.Until)
	}
	if f.After != nil {
		add("(started_at, id) < ($?, $?)", f.After.StartedAt, f.After.ID)
	}
	if f.Newest {
		// A scalar subquery, so a SubPlan: one probe of
		// ix_ingestion_batches_scope (its highest id) per row read,
		// whatever the statistics say (NOT EXISTS becomes an anti join,
		// which on an empty-statistics table may scan the tenant's whole
		// index for each row).
		where = append(where, `id = (SELECT max(later.id) FROM ingestion_batches later
			WHERE later.tenant_id = ingestion_batches.tenant_id AND later.source_scope = ingestion_batches.source_scope)`)
	}
	args = append(args, f.Limit+1)
	return fmt.Sprintf(`SELECT %s FROM ingestion_batches WHERE %s ORDER BY started_at DESC, id DESC LIMIT $%d`,
		columns, strings.Join(where, " AND "), len(args)), args, f.Limit
}
