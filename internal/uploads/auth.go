package uploads

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func (s *Server) bearerOK(r *http.Request) bool {
	if s.cfg.InsecureNoAuth && s.cfg.AuthToken == "" {
		return true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && tokenEqual(token, s.cfg.AuthToken)
}

// hmacOK verifies an HMAC signature over timestamp "." body, within the
// allowed age. It returns the replay key of a valid signature, or why it
// is not valid.
func (s *Server) hmacOK(r *http.Request, body []byte) (key, why string) {
	sig, ts := r.Header.Get(SignatureHeader), r.Header.Get(TimestampHeader)
	if len(s.cfg.HMACSecret) == 0 || sig == "" || ts == "" {
		return "", "missing credentials"
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", "bad timestamp"
	}
	age := time.Since(time.Unix(sec, 0))
	if age > s.cfg.SignatureMaxAge || age < -time.Minute {
		return "", "signature expired"
	}
	mac := hmac.New(sha256.New, s.cfg.HMACSecret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return "", "bad signature"
	}
	return "hmac:" + sig, ""
}

// Sign returns the signature headers for body at t, for clients and tests.
func Sign(secret, body []byte, t time.Time) (signature, timestamp string) {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil)), ts
}

// ReplayStore records the request signatures a listener accepted, in
// PostgreSQL, so that each is accepted once by every replica of enqueue
// serve, before and after restarts, until it expires. Rows hold a SHA-256
// of the signature and an expiry on the database clock; expired rows may
// be claimed again (their signature is refused as too old anyway) and are
// deleted by Prune. The table, ingest_seen_signatures, is authentication
// infrastructure (migration 00010), not batch state.
type ReplayStore struct {
	pool *pgxpool.Pool
}

// NewReplayStore returns the replay store of the database behind pool.
func NewReplayStore(pool *pgxpool.Pool) *ReplayStore { return &ReplayStore{pool: pool} }

func replayDigest(key string) []byte {
	d := sha256.Sum256([]byte(key))
	return d[:]
}

// Claim records key as used for ttl and reports whether it was new (or
// its previous record had expired). A false answer means a replay.
func (r *ReplayStore) Claim(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	var claimed bool
	err := r.pool.QueryRow(ctx, `
		INSERT INTO ingest_seen_signatures (digest, expires_at)
		VALUES ($1, now() + $2 * interval '1 microsecond')
		ON CONFLICT (digest) DO UPDATE SET expires_at = EXCLUDED.expires_at
		WHERE ingest_seen_signatures.expires_at <= now()
		RETURNING true`, replayDigest(key), ttl.Microseconds()).Scan(&claimed)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	return claimed, err
}

// Release forgets a claimed key, so the sender's retry of a request that
// failed on our side (5xx) is not refused as a replay.
func (r *ReplayStore) Release(ctx context.Context, key string) error {
	_, err := r.pool.Exec(ctx, `DELETE FROM ingest_seen_signatures WHERE digest = $1`, replayDigest(key))
	return err
}

// Prune deletes expired records and returns how many.
func (r *ReplayStore) Prune(ctx context.Context) (int64, error) {
	tag, err := r.pool.Exec(ctx, `DELETE FROM ingest_seen_signatures WHERE expires_at <= now()`)
	return tag.RowsAffected(), err
}
