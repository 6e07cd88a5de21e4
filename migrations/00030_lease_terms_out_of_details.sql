-- The lease audit trail moves out of the batch details into a narrow column
-- of its own, so that renewing a lease never rewrites the batch's details
-- document, however large it grows, and lease operations never touch a
-- details document at all (whatever its version).
--
-- execution_lease_terms is the bounded trail of lease terms (at most 16, the
-- oldest dropped first): holder, generation, acquisition time, expiry and
-- release time. Acquire appends a term and closes the one it took over (its
-- final expiry recorded); Release and terminal fenced writes close the
-- current one. Renewals do not touch it: while a term is open its expiry is
-- execution_lease_expires_at. execution_lease_renewed_at is the database
-- time of the last acquisition or renewal (what `status` shows as the last
-- heartbeat); migration 20 (operator control) adds it too, so it is added
-- here only if missing, and Down leaves it.
--
-- The trails of Running batches are copied from details->'leases' (each
-- term is closed except the current one of a batch still holding its lease)
-- and removed from their details documents, so the lease protocol continues
-- them. Finished batches keep theirs in details as history: rewriting every
-- row of a large table would hold this migration's lock for as long, and
-- ParseDetails reads (and drops) the legacy key. A lower fillfactor leaves
-- room on each page so that renewals are HOT updates (no index writes).

-- +goose Up
ALTER TABLE ingestion_batches
    ADD COLUMN execution_lease_terms jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN IF NOT EXISTS execution_lease_renewed_at timestamptz NULL;

UPDATE ingestion_batches b
SET execution_lease_terms = (
        SELECT COALESCE(jsonb_agg(
                   t.term - 'renewals' || jsonb_build_object('closed',
                       NOT (b.execution_lease_id IS NOT NULL
                            AND (t.term->>'generation')::bigint = b.execution_lease_generation))
                   ORDER BY t.i), '[]'::jsonb)
        FROM jsonb_array_elements(b.details->'leases') WITH ORDINALITY AS t(term, i)
        WHERE jsonb_typeof(t.term) = 'object'),
    details = b.details - 'leases'
WHERE b.status = 'Running'
  AND jsonb_typeof(b.details) = 'object' AND jsonb_typeof(b.details->'leases') = 'array';

ALTER TABLE ingestion_batches SET (fillfactor = 80);

-- +goose Down
ALTER TABLE ingestion_batches RESET (fillfactor);
UPDATE ingestion_batches
SET details = details || jsonb_build_object('leases', execution_lease_terms)
WHERE jsonb_typeof(details) = 'object' AND execution_lease_terms <> '[]'::jsonb;
ALTER TABLE ingestion_batches DROP COLUMN execution_lease_terms;
