package batch

import "context"

// ScopeOf names the batches of one folder: tenant and source scope.
type ScopeOf struct{ TenantID, SourceScope string }

// LatestMany returns the newest batch of each scope that has one, keyed by
// scope, in one statement (index ix_ingestion_batches_scope): Latest for a
// burst of folders.
func (s *Store) LatestMany(ctx context.Context, scopes []ScopeOf) (map[ScopeOf]Batch, error) {
	out := make(map[ScopeOf]Batch, len(scopes))
	if len(scopes) == 0 {
		return out, nil
	}
	tenants := make([]string, len(scopes))
	sources := make([]string, len(scopes))
	for i, k := range scopes {
		tenants[i], sources[i] = k.TenantID, k.SourceScope
	}
	rows, err := s.db.Query(ctx, `
		SELECT `+columns+` FROM ingestion_batches
		WHERE id IN (
			SELECT (SELECT max(b.id) FROM ingestion_batches b WHERE b.tenant_id = r.tenant_id AND b.source_scope = r.source_scope)
			FROM unnest($1::text[], $2::text[]) AS r(tenant_id, source_scope))`, tenants, sources)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return nil, err
		}
		out[ScopeOf{b.TenantID, b.Scope()}] = b
	}
	return out, rows.Err()
}
