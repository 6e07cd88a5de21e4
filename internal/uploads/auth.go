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

	"github.com/jackc/pgx/v5/pgxpool"
)

// importCaller is who a request to an import or read route comes as: the
// import token (every tenant), or a tenant token (its tenant only).
type importCaller struct {
	// tenant is the tenant of a tenant token; empty for the import token.
	tenant string
	// credential names the caller for the rate limit.
	credential string
}

// importCallerOf authenticates r with the import token or a tenant token
// (Config.TenantTokens), and false for neither.
func (s *Server) importCallerOf(r *http.Request) (importCaller, bool) {
	if s.bearerOK(r) {
		return importCaller{credential: s.bearerCredential()}, true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return importCaller{}, false
	}
	if tenant, ok := s.cfg.TenantTokens.Tenant(token); ok {
		return importCaller{tenant: tenant, credential: "tenant:" + tenant}, true
	}
	return importCaller{}, false
}

// bearerOK reports whether r carries one of the import tokens in force
// (any request does with InsecureNoAuth and no import token configured;
// a configured set with no value in force opens nothing).
func (s *Server) bearerOK(r *http.Request) bool {
	if s.cfg.InsecureNoAuth && s.cfg.ImportTokens == nil {
		return true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && s.isImportToken(token)
}

// hmacOK verifies an HMAC signature over timestamp "." body by one of the
// HMAC secrets in force, within the allowed age. It returns the replay key
// of a valid signature, or why it is not valid.
func (s *Server) hmacOK(r *http.Request, body []byte) (key, why string) {
	sig, ts := r.Header.Get(SignatureHeader), r.Header.Get(TimestampHeader)
	if len(currentValues(s.cfg.HMACSecrets)) == 0 || sig == "" || ts == "" {
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
	if !s.hmacSignatureOK(sig, ts, body) {
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
// infrastructure (migration 00010), not batch state. Every write goes
// through a function that owns it (migration 00080): the door's login may
// call them but not delete or rewrite a record itself, so it cannot reopen
// the replay of a request it captured.
type ReplayStore struct {
	pool *pgxpool.Pool
}

// NewReplayStore returns the replay store of the database behind pool.
func NewReplayStore(pool *pgxpool.Pool) *ReplayStore { return &ReplayStore{pool: pool} }

func replayDigest(key string) []byte {
	d := sha256.Sum256([]byte(key))
	return d[:]
}

// ReplayClaim is a recorded key and the token that may release it.
type ReplayClaim struct {
	key   string
	token []byte
}

// Claim records key as used for ttl (positive) and reports whether it was
// new (or its previous record had expired). A false answer means a replay.
// The claim of a new key holds the token that Release needs: nobody else
// can release it.
func (r *ReplayStore) Claim(ctx context.Context, key string, ttl time.Duration) (ReplayClaim, bool, error) {
	var token []byte
	err := r.pool.QueryRow(ctx, `SELECT ingest_claim_signature($1, $2 * interval '1 microsecond')`,
		replayDigest(key), ttl.Microseconds()).Scan(&token)
	if err != nil || token == nil {
		return ReplayClaim{}, false, err
	}
	return ReplayClaim{key: key, token: token}, true, nil
}

// Release forgets a claim, so the sender's retry of a request that failed
// on our side (5xx) is not refused as a replay. It reports whether the
// record was there to forget; releasing the zero ReplayClaim does nothing.
func (r *ReplayStore) Release(ctx context.Context, c ReplayClaim) (bool, error) {
	if c.token == nil {
		return false, nil
	}
	var released bool
	err := r.pool.QueryRow(ctx, `SELECT ingest_release_signature($1, $2)`, replayDigest(c.key), c.token).Scan(&released)
	return released, err
}

// Prune deletes expired records and returns how many.
func (r *ReplayStore) Prune(ctx context.Context) (int64, error) {
	var n int64
	err := r.pool.QueryRow(ctx, `SELECT ingest_prune_signatures()`).Scan(&n)
	return n, err
}
