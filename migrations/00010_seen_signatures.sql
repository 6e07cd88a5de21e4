-- Replay protection for signed upload notifications (enqueue serve).
--
-- A request authenticated by a signature (X-Fleet-Signature HMAC, or an
-- Amazon SNS message signature) is accepted once: its SHA-256 is recorded
-- here until it expires, so every replica of enqueue serve, before and after
-- a restart, refuses a replay. This is authentication infrastructure, like
-- River's tables, not batch state: it holds no tenant data, only digests and
-- expiries, and rows are deleted once expired.

-- +goose Up
CREATE TABLE ingest_seen_signatures (
    digest     bytea       PRIMARY KEY CHECK (length(digest) = 32),
    expires_at timestamptz NOT NULL
);

CREATE INDEX ix_ingest_seen_signatures_expiry ON ingest_seen_signatures (expires_at);

-- +goose Down
DROP TABLE ingest_seen_signatures;
