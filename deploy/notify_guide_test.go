package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/notify"
	"github.com/fleet/ingest/internal/testkit/testdeps"
)

// guideFence returns the body of the first fenced block (```lang) after
// the marker <!-- deploy-guide: NAME --> of docs/deploy.md.
func guideFence(t *testing.T, name, lang string) string {
	t.Helper()
	raw, err := os.ReadFile("../docs/deploy.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(raw), "<!-- deploy-guide: "+name+" -->")
	require.True(t, ok, "docs/deploy.md has no %s block", name)
	_, rest, ok = strings.Cut(rest, "```"+lang+"\n")
	require.True(t, ok, "%s: no ```%s block", name, lang)
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	return block
}

// TestDeployGuideNotificationsFileParses: the destinations file
// docs/deploy.md tells operators to write is one the worker accepts, with
// each kind of destination.
func TestDeployGuideNotificationsFileParses(t *testing.T) {
	t.Parallel()
	cfg, err := notify.Parse([]byte(guideFence(t, "notifications-file", "json")))
	require.NoError(t, err)
	tenants, destinations := cfg.Counts()
	require.Equal(t, 2, tenants)
	require.Equal(t, 3, destinations)
	hook, ok := cfg.Destination("acme", "ops-hook")
	require.True(t, ok)
	require.Equal(t, notify.KindWebhook, hook.Kind)
	topic, ok := cfg.Destination("acme", "alerts")
	require.True(t, ok)
	require.Equal(t, notify.KindSNS, topic.Kind)
}

// TestDeployGuideWebhookSignature: the known answer docs/deploy.md gives
// webhook receivers is what the worker sends: the body is a notification
// exactly as the worker encodes it, the headers its event and key, and
// the signature the worker's for that secret and timestamp (also as the
// guide's openssl line computes it, where openssl is installed).
func TestDeployGuideWebhookSignature(t *testing.T) {
	t.Parallel()
	fields := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(guideFence(t, "webhook-signature", "")), "\n") {
		k, v, ok := strings.Cut(line, ":")
		require.True(t, ok, line)
		fields[k] = strings.TrimSpace(v)
	}
	secret, body := []byte(fields["secret"]), []byte(fields["body"])
	sec, err := strconv.ParseInt(fields[notify.HeaderTimestamp], 10, 64)
	require.NoError(t, err)

	var n notify.Notification
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&n))
	require.NoError(t, n.Validate())
	again, err := n.Body()
	require.NoError(t, err)
	require.Equal(t, string(again), string(body), "the body as the worker encodes it")
	require.Equal(t, notify.Key(batch.Ref{ID: 42, UID: "0f8b5e1c-3a2d-4c6e-9b7a-5d4e3f2a1b0c"}, notify.OutcomeFailed, 3), n.IdempotencyKey)
	require.Equal(t, n.IdempotencyKey, fields[notify.HeaderIdempotencyKey])
	require.Equal(t, n.Outcome.Event(), fields[notify.HeaderEvent])

	sig, ts := notify.Sign(secret, body, time.Unix(sec, 0))
	require.Equal(t, fields[notify.HeaderTimestamp], ts)
	require.Equal(t, sig, fields[notify.HeaderSignature])
	require.NoError(t, notify.Verify(secret, body, sig, ts, 5*time.Minute, time.Unix(sec+30, 0)))

	raw, err := os.ReadFile("../docs/deploy.md")
	require.NoError(t, err)
	require.Contains(t, string(raw), "# "+sig+" for the example above")
	var openssl string
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, "openssl dgst") && strings.HasPrefix(line, "printf") {
			openssl = line
		}
	}
	require.NotEmpty(t, openssl, "docs/deploy.md has no openssl line")
	if _, err := exec.LookPath("openssl"); err != nil {
		testdeps.Missing(t, "openssl (to run the guide's openssl line)", "apt-get install openssl", err)
		return
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "body.json"), body, 0o600))
	cmd := exec.Command("sh", "-c", openssl)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TS="+ts, "SECRET="+string(secret))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, sig, strings.TrimSpace(string(out)), "the guide's openssl line")
}
