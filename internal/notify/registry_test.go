package notify

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// secretVolume is a directory laid out as the kubelet mounts a Secret: the
// file is a symlink through ..data, and an update swaps ..data atomically
// to a new directory.
type secretVolume struct {
	dir string
	n   int
}

func (v *secretVolume) path() string { return filepath.Join(v.dir, "notifications.json") }

func newSecretVolume(t *testing.T, content string) *secretVolume {
	v := &secretVolume{dir: t.TempDir()}
	v.update(t, content)
	require.NoError(t, os.Symlink(filepath.Join("..data", "notifications.json"), v.path()))
	return v
}

func (v *secretVolume) update(t *testing.T, content string) {
	t.Helper()
	v.n++
	version := fmt.Sprintf("..v%d", v.n)
	require.NoError(t, os.Mkdir(filepath.Join(v.dir, version), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(v.dir, version, "notifications.json"), []byte(content), 0o600))
	tmp := filepath.Join(v.dir, "..data_tmp")
	require.NoError(t, os.Symlink(version, tmp))
	require.NoError(t, os.Rename(tmp, filepath.Join(v.dir, "..data")))
}

func oneHook(tenant, name string) string {
	return `{"tenants": {"` + tenant + `": [{"name": "` + name + `", "kind": "webhook", "url": "https://hooks.example/` + name + `", "secret": "` + secretA + `"}]}}`
}

func names(ds []Destination) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}

// eventually polls cond until it holds, failing after five seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRegistryReloads: an update of the mounted Secret is picked up; a
// broken update keeps the destinations last read, is counted and logged
// without the secret it holds; a fixed file is picked up again.
func TestRegistryReloads(t *testing.T) {
	vol := newSecretVolume(t, oneHook("acme", "first"))
	var logs testproc.SyncBuffer
	m := metrics.New()
	reg, err := NewRegistry(vol.path(), slog.New(slog.NewTextHandler(&logs, nil)), m.NotificationConfigReloadFailures)
	require.NoError(t, err)
	require.Equal(t, []string{"first"}, names(reg.Destinations("acme")))
	require.Contains(t, logs.String(), "notification destinations loaded")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { reg.Watch(ctx, 10*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()

	vol.update(t, oneHook("acme", "second"))
	eventually(t, "the update", func() bool { return reg.Destinations("acme")[0].Name == "second" })
	_, ok := reg.Destination("acme", "second")
	require.True(t, ok)
	_, ok = reg.Destination("acme", "first")
	require.False(t, ok, "a destination removed from the file is gone")
	require.Zero(t, testutil.ToFloat64(m.NotificationConfigReloadFailures))

	// A broken update: an http URL to a public host carrying a token, and
	// a secret too short.
	leaky := "tok-" + secretA
	vol.update(t, `{"tenants": {"acme": [{"name": "third", "kind": "webhook", "url": "http://hooks.example/x?token=`+leaky+`", "secret": "short-secret-15"}]}}`)
	eventually(t, "the failure to be counted", func() bool { return testutil.ToFloat64(m.NotificationConfigReloadFailures) >= 1 })
	require.Equal(t, []string{"second"}, names(reg.Destinations("acme")), "the last good destinations stay")
	require.Contains(t, logs.String(), "reloading notification destinations failed")
	require.Contains(t, logs.String(), `destination 0 (\"third\"): url: must be https`)
	require.NotContains(t, logs.String(), leaky)
	require.NotContains(t, logs.String(), "short-secret-15")
	require.NotContains(t, logs.String(), secretA)

	// Each tick of a broken file counts again (an alert can use rate()).
	failures := testutil.ToFloat64(m.NotificationConfigReloadFailures)
	eventually(t, "another failed reload", func() bool { return testutil.ToFloat64(m.NotificationConfigReloadFailures) > failures })

	vol.update(t, oneHook("acme", "fourth"))
	eventually(t, "the fixed file", func() bool { return reg.Destinations("acme")[0].Name == "fourth" })

	// A file that disappears keeps the destinations too.
	require.NoError(t, os.Remove(vol.path()))
	failures = testutil.ToFloat64(m.NotificationConfigReloadFailures)
	eventually(t, "the missing file's failure", func() bool { return testutil.ToFloat64(m.NotificationConfigReloadFailures) > failures })
	require.Equal(t, []string{"fourth"}, names(reg.Destinations("acme")))
}

func TestRegistryStartRefusesABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"tenants": {"acme": [{"name": "h", "kind": "webhook", "url": "https://h.example/", "secret": "short-secret-15"}]}}`), 0o600))
	failures := prometheus.NewCounter(prometheus.CounterOpts{Name: "f"})
	_, err := NewRegistry(path, nil, failures)
	require.ErrorContains(t, err, `tenant "acme": destination 0 ("h"): secret: must be at least 16 bytes`)
	require.NotContains(t, err.Error(), "short-secret-15")
	_, err = NewRegistry(filepath.Join(t.TempDir(), "missing.json"), nil, failures)
	require.ErrorContains(t, err, "no such file")
	require.Zero(t, testutil.ToFloat64(failures), "a failed start is an error, not a reload failure")
}

// TestRegistryWithoutFile: no path is no destinations for anyone, and
// Watch has nothing to do.
func TestRegistryWithoutFile(t *testing.T) {
	reg, err := NewRegistry("", nil, nil)
	require.NoError(t, err)
	require.Empty(t, reg.Destinations("acme"))
	_, ok := reg.Destination("acme", "x")
	require.False(t, ok)
	returned := make(chan struct{})
	go func() { reg.Watch(context.Background(), time.Millisecond); close(returned) }()
	testproc.Await(t, returned, "Watch without a file to return")

	var none *Registry
	require.Empty(t, none.Destinations("acme"))
}
