-- Fairness between tenants (worker run --max-running-per-tenant).
--
-- An acquisition under a per-tenant cap counts the tenant's batches that
-- hold a lease, under a transaction-scoped advisory lock of the tenant.
-- This partial index holds only those rows (at most the fleet's total
-- concurrency), so the count never reads a tenant's history or backlog.
-- Renewals change none of its columns and stay HOT updates; acquisitions
-- and releases, which set and clear execution_lease_id, add one entry to
-- it or leave one behind for vacuum.

-- +goose Up
CREATE INDEX ix_ingestion_batches_tenant_leased
    ON ingestion_batches (tenant_id)
    WHERE status = 'Running' AND execution_lease_id IS NOT NULL;

-- +goose Down
DROP INDEX ix_ingestion_batches_tenant_leased;
