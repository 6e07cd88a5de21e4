-- The operators' audit: every operator action, who, what, when and why
-- (internal/audit; enqueue audit reads it).
--
-- An operator action (cancel, retry, resume, prune, a River UI job action,
-- a queue's pause or resume) writes one row, in the action's own
-- transaction where the action is ours (cancel, retry, resume, prune), so a
-- change is never without its row nor a row without its change; the River
-- UI's own actions (River's transactions) are recorded as soon as River
-- answered.
--
--   actor   who, from the credential: the name the operator token carries
--           (enqueue serve's --operator-token-file), or the database login
--           of a command (enqueue cancel, retry, resume, prune).
--   login   the database login that wrote the row (current_user), set by
--           the database: roles.sql grants no runtime role this column,
--           nor at, nor id.
--   door    cli, http (the cancel route) or riverui.
--   note    what the caller says of itself (enqueue --by, the OS user,
--           X-Fleet-Operator, the River UI's Basic user name, the client's
--           address): free text, never the identity.
--   details the action's answer (its outcome's fields) as JSON.
--
-- Append-only: no runtime role holds UPDATE, DELETE or TRUNCATE (roles.sql),
-- and a trigger refuses UPDATE and DELETE (SQLSTATE 42501) to every role
-- but the table's owner (the role that migrates), which alone may delete
-- old rows (retention).

-- +goose Up
CREATE TABLE ingest_operator_actions (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    login     text        NOT NULL DEFAULT current_user,
    actor     text        NOT NULL CHECK (actor <> '' AND length(actor) <= 200),
    door      text        NOT NULL CHECK (door <> '' AND length(door) <= 20),
    action    text        NOT NULL CHECK (action <> '' AND length(action) <= 40),
    outcome   text        NOT NULL DEFAULT '' CHECK (length(outcome) <= 60),
    batch_id  bigint      NULL,
    tenant_id text        NULL CHECK (length(tenant_id) <= 200),
    queue     text        NULL CHECK (length(queue) <= 200),
    reason    text        NOT NULL DEFAULT '' CHECK (length(reason) <= 500),
    note      text        NOT NULL DEFAULT '' CHECK (length(note) <= 500),
    details   jsonb       NOT NULL DEFAULT '{}'::jsonb
);

-- enqueue audit --since reads the newest first.
CREATE INDEX ix_ingest_operator_actions_at ON ingest_operator_actions (at DESC, id DESC);

-- +goose StatementBegin
CREATE FUNCTION ingest_operator_actions_append_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    RAISE EXCEPTION 'permission denied: the operator audit is append-only (% by %)', TG_OP, current_user
        USING ERRCODE = 'insufficient_privilege', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER ingest_operator_actions_append_only
    BEFORE UPDATE OR DELETE ON ingest_operator_actions
    FOR EACH ROW EXECUTE FUNCTION ingest_operator_actions_append_only();

-- +goose Down
DROP TABLE ingest_operator_actions;
DROP FUNCTION ingest_operator_actions_append_only();
