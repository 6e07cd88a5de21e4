package uploads

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/testkit/pgtest"
)

func jsonBody(v map[string]any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestHTTPImportsAreS3ImportsOfTheFolderTenant tries, with the one shared
// bearer token, what an attacker would: host directories, other buckets,
// another tenant's folder under a tenant of one's choosing. Each is refused
// 422 naming the field, and nothing is written.
func TestHTTPImportsAreS3ImportsOfTheFolderTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.Mapping.Buckets = []string{"allowed-bkt"} })
	acme := "s3://allowed-bkt/tenants/acme/acme_db/c-7/2026-11-30/up-1"

	for name, tc := range map[string]struct {
		body       map[string]any
		field, why string
	}{
		"host directory as another tenant": {map[string]any{"tenant_id": "evil", "tenant_database": "db", "company_id": "c", "folder": "file:///srv/other-app/"}, "folder", "only s3:// folders"},
		"host system directory":            {map[string]any{"tenant_id": "evil", "tenant_database": "db", "company_id": "c", "folder": "file:///etc"}, "folder", "only s3:// folders"},
		"in-memory bucket":                 {map[string]any{"tenant_id": "evil", "tenant_database": "db", "company_id": "c", "folder": "mem://bucket/x"}, "folder", "only s3:// folders"},
		"bucket not accepted":              {map[string]any{"folder": "s3://other-bkt/tenants/acme/acme_db/c-7/x"}, "folder", `bucket "other-bkt" is not accepted`},
		"folder outside the pattern":       {map[string]any{"folder": "s3://allowed-bkt/exports/acme/acme_db/c-7/x"}, "folder", "does not match"},
		"acme's folder as tenant evil":     {map[string]any{"tenant_id": "evil", "folder": acme}, "tenant_id", `names tenant_id "acme", the request "evil"`},
		"acme's folder as another db":      {map[string]any{"tenant_database": "evil_db", "folder": acme}, "tenant_database", `"acme_db"`},
		"acme's folder as another company": {map[string]any{"company_id": "c-8", "folder": acme}, "company_id", `"c-7"`},
		"no folder":                        {map[string]any{"tenant_id": "acme"}, "folder", "invalid source folder"},
	} {
		status, out := f.post(t, "/v1/imports", "application/json", jsonBody(tc.body), auth)
		require.Equal(t, http.StatusUnprocessableEntity, status, "%s: %v", name, out)
		require.Equal(t, "invalid_input", out["outcome"], name)
		require.Equal(t, tc.field, out["field"], name)
		require.Contains(t, out["error"], tc.why, name)
		require.NotContains(t, out["error"], "/srv", "%s: no host path is echoed", name)
	}
	require.Zero(t, count(t, pool), "refused requests write nothing")
	require.Equal(t, float64(9), counterValue(t, f.m, routeImports, "invalid"))

	// The folder names its tenant; the body may say nothing, or the same.
	status, out := f.post(t, "/v1/imports", "application/json", jsonBody(map[string]any{"folder": acme}), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	b, err := batch.NewStore(pool).Get(ctx, int64(out["batch_id"].(float64)))
	require.NoError(t, err)
	require.Equal(t, []string{"acme", "acme_db", "c-7"}, []string{b.TenantID, b.TenantDatabase, b.CompanyID})
	status, out = f.post(t, "/v1/imports", "application/json",
		jsonBody(map[string]any{"tenant_id": "acme", "tenant_database": "acme_db", "company_id": "c-7", "folder": "s3://ALLOWED-bkt//tenants/acme/acme_db/c-7/2026-11-30/up-1/"}), auth)
	require.Equal(t, http.StatusConflict, status, out)
	require.Equal(t, 1, count(t, pool))
}

// TestLocalFoldersOnlyWhenAllowed: file:// over HTTP is a development
// switch, imported as the body's tenant.
func TestLocalFoldersOnlyWhenAllowed(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.AllowLocalFolders = true })
	status, out := f.post(t, "/v1/imports", "application/json", importBody("dev", "file:///tmp/fleet-dev/up-1"), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	status, out = f.post(t, "/v1/imports", "application/json", jsonBody(map[string]any{"folder": "file:///tmp/fleet-dev/up-2"}), auth)
	require.Equal(t, http.StatusUnprocessableEntity, status, "a local folder names no tenant: the body must")
	require.Equal(t, "invalid_input", out["outcome"])
}

// TestSignedRequestsAreAcceptedOnceByEveryReplica: three listeners share
// the database, as replicas do and as a restarted process does; a signature
// accepted by one is refused by all. A request that failed on our side
// (5xx) may be retried with the same signature.
func TestSignedRequestsAreAcceptedOnceByEveryReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	a, b := newServer(t, pool, nil), newServer(t, pool, nil)
	body := s3Event("fleet-uploads", "tenants/t1/db1/c1/replay/_SUCCESS", "ObjectCreated:Put")
	hdr := signed(body)

	status, out := a.post(t, "/v1/events/s3", "application/json", body, hdr)
	require.Equal(t, http.StatusAccepted, status, out)
	status, out = b.post(t, "/v1/events/s3", "application/json", body, hdr)
	require.Equal(t, http.StatusUnauthorized, status, "another replica refuses the replay")
	require.Contains(t, out["error"], "already used")
	restarted := newServer(t, pool, nil)
	status, _ = restarted.post(t, "/v1/events/s3", "application/json", body, hdr)
	require.Equal(t, http.StatusUnauthorized, status, "so does a restarted process")
	require.Equal(t, 1, count(t, pool))

	// A 5xx releases the signature for the sender's retry.
	_, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no jobs (injected)'; END $$;
		CREATE TRIGGER refuse_jobs BEFORE INSERT ON river_job FOR EACH ROW EXECUTE FUNCTION refuse_jobs();`)
	require.NoError(t, err)
	retry := s3Event("fleet-uploads", "tenants/t1/db1/c1/retry/_SUCCESS", "ObjectCreated:Put")
	retryHdr := signed(retry)
	status, _ = a.post(t, "/v1/events/s3", "application/json", retry, retryHdr)
	require.Equal(t, http.StatusInternalServerError, status)
	_, err = pool.Exec(ctx, `DROP TRIGGER refuse_jobs ON river_job`)
	require.NoError(t, err)
	status, out = b.post(t, "/v1/events/s3", "application/json", retry, retryHdr)
	require.Equal(t, http.StatusAccepted, status, out)
	status, _ = a.post(t, "/v1/events/s3", "application/json", retry, retryHdr)
	require.Equal(t, http.StatusUnauthorized, status)
}

// TestReplayRecordsExpireAndArePruned: an expired record no longer blocks
// its key and is deleted by Prune; live records stay.
func TestReplayRecordsExpireAndArePruned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := NewReplayStore(pool)

	_, first, err := store.Claim(ctx, "live", time.Hour)
	require.NoError(t, err)
	require.True(t, first)
	_, again, err := store.Claim(ctx, "live", time.Hour)
	require.NoError(t, err)
	require.False(t, again)

	_, first, err = store.Claim(ctx, "expired", time.Microsecond)
	require.NoError(t, err)
	require.True(t, first)
	require.Eventually(t, func() bool {
		var expired bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT bool_and(expires_at <= now()) FROM ingest_seen_signatures WHERE digest = $1`, replayDigest("expired")).Scan(&expired))
		return expired
	}, 30*time.Second, 10*time.Millisecond)
	n, err := store.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ingest_seen_signatures`).Scan(&left))
	require.Equal(t, 1, left, "the live record stays")
	_, first, err = store.Claim(ctx, "expired", time.Hour)
	require.NoError(t, err)
	require.True(t, first, "a pruned key may be claimed again (its signature is too old to verify anyway)")
}

// TestReplayReleaseNeedsTheClaimsToken: a claim is released only with the
// token its Claim returned (another claim's token, or none, releases
// nothing), and a claim whose record expired and was claimed again cannot
// release the new one. Only the token's hash is stored.
func TestReplayReleaseNeedsTheClaimsToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	store := NewReplayStore(pool)

	mine, first, err := store.Claim(ctx, "mine", time.Hour)
	require.NoError(t, err)
	require.True(t, first)
	require.Len(t, mine.token, 32)
	other, first, err := store.Claim(ctx, "other", time.Hour)
	require.NoError(t, err)
	require.True(t, first)
	require.NotEqual(t, mine.token, other.token)

	for name, c := range map[string]ReplayClaim{
		"another claim's token": {key: "mine", token: other.token},
		"no token":              {key: "mine"},
		"an empty token":        {key: "mine", token: []byte{}},
	} {
		released, err := store.Release(ctx, c)
		require.NoError(t, err, name)
		require.False(t, released, name)
	}
	var stored []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT claim_hash FROM ingest_seen_signatures WHERE digest = $1`, replayDigest("mine")).Scan(&stored))
	require.NotEqual(t, mine.token, stored, "the token itself is not stored")
	_, again, err := store.Claim(ctx, "mine", time.Hour)
	require.NoError(t, err)
	require.False(t, again, "still recorded")

	released, err := store.Release(ctx, mine)
	require.NoError(t, err)
	require.True(t, released)
	renewed, first, err := store.Claim(ctx, "mine", time.Hour)
	require.NoError(t, err)
	require.True(t, first, "released: the sender's retry is accepted")
	released, err = store.Release(ctx, mine)
	require.NoError(t, err)
	require.False(t, released, "the first claim's token does not release the second claim")
	released, err = store.Release(ctx, renewed)
	require.NoError(t, err)
	require.True(t, released)

	_, _, err = store.Claim(ctx, "never", 0)
	require.Error(t, err, "a claim needs a positive time to live")
}

// TestInvisibleCharactersAreRefusedAtTheDoor: U+034F (combining grapheme
// joiner) and U+3164 (Hangul filler) render as nothing or as a blank and
// passed the deny-list of format characters, so a folder or a tenant id
// holding one looked like another tenant's and was imported. On both
// routes they are refused 422 invalid_input naming the field (folder, or
// the tenant_id / company_id of a local folder's body), the character and
// the allow-list, and nothing is written; the tests' usual ids pass.
func TestInvisibleCharactersAreRefusedAtTheDoor(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	f := newServer(t, pool, func(c *Config) { c.AllowLocalFolders = true })

	for name, tc := range map[string]struct {
		body       []byte
		field, why string
	}{
		"U+034F in the folder's tenant": {jsonBody(map[string]any{"folder": tenantFolder("ac\u034fme", "up-1")}), "folder", "U+034F"},
		"U+3164 as the folder's tenant": {jsonBody(map[string]any{"folder": tenantFolder("\u3164", "up-1")}), "folder", "U+3164"},
		"U+3164 deeper in the folder":   {jsonBody(map[string]any{"folder": tenantFolder("acme", "up\u3164")}), "folder", "U+3164"},
		"U+FFA0 in the folder":          {jsonBody(map[string]any{"folder": tenantFolder("acme\uffa0", "up-1")}), "folder", "U+FFA0"},
		"a tenant segment S3 allows":    {jsonBody(map[string]any{"folder": tenantFolder("acme:1", "up-1")}), "tenant_id", `':'`},
		"U+3164 as a body's tenant":     {importBody("\u3164", "file:///tmp/fleet-dev/up-1"), "tenant_id", "U+3164"},
		"U+034F in a body's tenant":     {importBody("ac\u034fme", "file:///tmp/fleet-dev/up-1"), "tenant_id", "U+034F"},
		"U+115F in a body's company": {jsonBody(map[string]any{"tenant_id": "acme", "tenant_database": "tenant_db", "company_id": "\u115fc1",
			"folder": "file:///tmp/fleet-dev/up-1"}), "company_id", "U+115F"},
	} {
		status, out := f.post(t, "/v1/imports", "application/json", tc.body, auth)
		require.Equal(t, http.StatusUnprocessableEntity, status, "%s: %v", name, out)
		require.Equal(t, "invalid_input", out["outcome"], name)
		require.Equal(t, tc.field, out["field"], "%s: %v", name, out)
		require.Contains(t, out["error"], tc.why, name)
		require.Contains(t, out["error"], "only letters, digits", "%s: the error states the allow-list", name)
	}
	for _, key := range []string{"tenants/ac\u034fme/tenant_db/c1/up-1/_SUCCESS", "tenants/\u3164/tenant_db/c1/up-1/_SUCCESS"} {
		body := s3Event("fleet-bucket", key, "ObjectCreated:Put")
		status, out := f.post(t, "/v1/events/s3", "application/json", body, signed(body))
		require.Equal(t, http.StatusUnprocessableEntity, status, "%q: %v", key, out)
		r := out["results"].([]any)[0].(map[string]any)
		require.Equal(t, "invalid_input", r["outcome"], "%q: %v", key, r)
		require.Equal(t, "folder", r["field"], "%q: %v", key, r)
	}
	require.Zero(t, count(t, pool), "nothing was written")

	status, out := f.post(t, "/v1/imports", "application/json", jsonBody(map[string]any{"folder": tenantFolder("tenant-a", "up-1")}), auth)
	require.Equal(t, http.StatusAccepted, status, out)
	status, out = f.post(t, "/v1/imports", "application/json", importBody("ａｃｍｅ", "file:///tmp/fleet-dev/up-1"), auth)
	require.Equal(t, http.StatusAccepted, status, out)
}
