-- Writes the door login may ask for but not make itself (deploy/postgres/roles.sql).
--
-- Replay records (ingest_seen_signatures, migration 00010). A login that
-- could DELETE or UPDATE these rows could reopen the replay of any signed
-- request it captured. The three writes enqueue serve needs are functions
-- that own them (SECURITY DEFINER: they run as the owner of the table, the
-- role that migrates), and roles.sql grants the door only EXECUTE on them
-- and SELECT of the digests and expiries:
--
--   ingest_claim_signature(digest, ttl) records a digest for ttl (positive)
--     and returns a random token, or NULL when the digest is recorded and
--     unexpired (a replay). Only the token's SHA-256 is stored.
--   ingest_release_signature(digest, token) forgets a claim, so the
--     sender's retry of a request that failed on our side is accepted; only
--     with the token its claim returned, so no caller releases another
--     replica's (or another request's) fresh claim.
--   ingest_prune_signatures() deletes expired records only.
--
-- Records written before this migration have no token hash: they cannot be
-- released, only expire (minutes).
--
-- Reconcile checkpoints (ingest_reconcile_checkpoints, migration 00040).
-- A checkpoint dated in the future silences enqueue reconcile --every (a
-- last_run_at ahead makes every period skip; a covered_since ahead makes it
-- skip every marker). Every timestamp of a checkpoint is the database time
-- of a pass that ran, so none may be later than now(): a trigger refuses
-- such a write from anyone (SQLSTATE 23514, constraint
-- ingest_reconcile_checkpoints_clock). Rows already in the table are not
-- checked here; reconcile ignores a checkpoint ahead of the database clock
-- when it reads one (and counts it: ingest_reconcile_checkpoints_ignored_total).

-- +goose Up
ALTER TABLE ingest_seen_signatures
    ADD COLUMN claim_hash bytea NULL CHECK (length(claim_hash) = 32);

-- +goose StatementBegin
CREATE FUNCTION ingest_claim_signature(claim_digest bytea, ttl interval) RETURNS bytea
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    -- 32 bytes from two version-4 UUIDs (pg_strong_random): 244 random bits.
    token bytea := decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex');
BEGIN
    IF ttl IS NULL OR ttl <= interval '0' THEN
        RAISE EXCEPTION 'a signature claim needs a positive time to live, not %', ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO public.ingest_seen_signatures AS s (digest, expires_at, claim_hash)
    VALUES (claim_digest, now() + ttl, sha256(token))
    ON CONFLICT (digest) DO UPDATE SET expires_at = EXCLUDED.expires_at, claim_hash = EXCLUDED.claim_hash
    WHERE s.expires_at <= now();
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN token;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION ingest_release_signature(claim_digest bytea, token bytea) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    DELETE FROM public.ingest_seen_signatures
    WHERE digest = claim_digest AND claim_hash = sha256(token);
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION ingest_prune_signatures() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    pruned bigint;
BEGIN
    DELETE FROM public.ingest_seen_signatures WHERE expires_at <= now();
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;
-- +goose StatementEnd

-- Functions are executable by PUBLIC by default: only the owner and the
-- roles roles.sql grants may call these.
REVOKE ALL ON FUNCTION ingest_claim_signature(bytea, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION ingest_release_signature(bytea, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION ingest_prune_signatures() FROM PUBLIC;

-- +goose StatementBegin
CREATE FUNCTION ingest_reconcile_checkpoint_clock() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NEW.pass_started_at > now() OR NEW.covered_since > now() OR NEW.last_run_at > now() THEN
        RAISE EXCEPTION 'a reconcile checkpoint may not be dated after the database clock (%)', now()
            USING ERRCODE = 'check_violation',
                  CONSTRAINT = 'ingest_reconcile_checkpoints_clock',
                  TABLE = 'ingest_reconcile_checkpoints',
                  DETAIL = format('pass_started_at %s, covered_since %s, last_run_at %s',
                                  NEW.pass_started_at, NEW.covered_since, NEW.last_run_at);
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER ingest_reconcile_checkpoints_clock
    BEFORE INSERT OR UPDATE ON ingest_reconcile_checkpoints
    FOR EACH ROW EXECUTE FUNCTION ingest_reconcile_checkpoint_clock();

-- +goose Down
DROP TRIGGER ingest_reconcile_checkpoints_clock ON ingest_reconcile_checkpoints;
DROP FUNCTION ingest_reconcile_checkpoint_clock();
DROP FUNCTION ingest_prune_signatures();
DROP FUNCTION ingest_release_signature(bytea, bytea);
DROP FUNCTION ingest_claim_signature(bytea, interval);
ALTER TABLE ingest_seen_signatures DROP COLUMN claim_hash;
