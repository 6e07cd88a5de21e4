-- Who moved a reconcile checkpoint (ingest_reconcile_checkpoints, migration
-- 00040).
--
-- The door's login (fleet_enqueue) keeps reconcile's checkpoints, and so
-- could move one itself: a covered_since of now() hides every older folder
-- a notification missed, a start_after past every key ends the pass, a
-- last_run_at of now() makes periods skip. Migration 00080 refuses only
-- times after the database clock. Here every write of a checkpoint records
-- who made it, by a trigger no runtime login can bypass or forge:
--
--   moved_by           current_user of the writing session
--   moved_application  its application_name (enqueue reconcile sets
--                      fleet-ingest-reconcile for its checkpoint writes)
--   moved_at           the database time of the write
--
-- enqueue reconcile trusts a checkpoint only when its last move was its
-- own (its application name and its own current_user); any other is
-- ignored (a new pass starts, checking every marker) and counted
-- (ingest_reconcile_checkpoints_foreign_total, alert
-- FleetIngestReconcileSilenced). Rows written before this migration have no
-- mover: reconcile starts one new pass over them, without counting them.
-- application_name is the client's to set: give reconcile a login of its
-- own (docs/deploy.md) and a door posing as reconcile is told apart by
-- current_user.

-- +goose Up
ALTER TABLE ingest_reconcile_checkpoints
    ADD COLUMN moved_by          text        NULL,
    ADD COLUMN moved_application text        NULL,
    ADD COLUMN moved_at          timestamptz NULL;

-- +goose StatementBegin
CREATE FUNCTION ingest_reconcile_checkpoint_mover() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    NEW.moved_by := current_user;
    NEW.moved_application := current_setting('application_name');
    NEW.moved_at := now();
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER ingest_reconcile_checkpoints_mover
    BEFORE INSERT OR UPDATE ON ingest_reconcile_checkpoints
    FOR EACH ROW EXECUTE FUNCTION ingest_reconcile_checkpoint_mover();

-- +goose Down
DROP TRIGGER ingest_reconcile_checkpoints_mover ON ingest_reconcile_checkpoints;
DROP FUNCTION ingest_reconcile_checkpoint_mover();
ALTER TABLE ingest_reconcile_checkpoints
    DROP COLUMN moved_at,
    DROP COLUMN moved_application,
    DROP COLUMN moved_by;
