package notify

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ReloadDefault is how often a Registry checks its file for a change.
const ReloadDefault = 10 * time.Second

// Registry holds the destinations file and reloads it when it changes
// (Watch), the way enqueue serve holds its tenant tokens file: a
// destination added to the file is used, and one removed no longer is,
// within the reload interval and without a restart. A file that can no
// longer be read or parsed keeps the destinations last read, logged and
// counted. A Registry without a file (path "") has no destination for
// anyone; so has a nil *Registry.
type Registry struct {
	path     string
	logger   *slog.Logger
	failures prometheus.Counter

	mu  sync.RWMutex
	cfg *Config
	raw []byte // the file as last read, to tell a change
}

// NewRegistry reads the destinations file at path ("" for none). An
// unreadable or invalid file is an error: a worker does not start without
// the destinations it was told to use. failures (may be nil) counts the
// reloads that fail afterwards (metrics.Metrics.NotificationConfigReloadFailures);
// logger (may be nil) logs every load and failed reload, never a secret.
func NewRegistry(path string, logger *slog.Logger, failures prometheus.Counter) (*Registry, error) {
	r := &Registry{path: path, logger: logger, failures: failures, cfg: &Config{}}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Path is the file the registry reads ("" for none).
func (r *Registry) Path() string {
	if r == nil {
		return ""
	}
	return r.path
}

// Reload reads the file again and, if it changed and parses, replaces the
// destinations. It returns the error of a file that cannot be read or
// parsed, keeping the destinations it had.
func (r *Registry) Reload() error {
	if r.path == "" {
		return nil
	}
	raw, err := os.ReadFile(r.path)
	if err != nil {
		return fmt.Errorf("notifications file: %w", err)
	}
	r.mu.RLock()
	same := r.raw != nil && bytes.Equal(raw, r.raw)
	r.mu.RUnlock()
	if same {
		return nil
	}
	cfg, err := Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", r.path, err)
	}
	r.mu.Lock()
	r.cfg, r.raw = cfg, raw
	r.mu.Unlock()
	if r.logger != nil {
		tenants, destinations := cfg.Counts()
		r.logger.Info("notification destinations loaded", "path", r.path, "tenants", tenants, "destinations", destinations)
	}
	return nil
}

// Watch reloads the file every interval until ctx ends (Kubernetes updates
// a mounted Secret by swapping a symlink: reading the path again sees the
// new file, where a watch on the old inode would not). A reload that fails
// is logged and counted, and the destinations last read stay. Without a
// file Watch returns at once.
func (r *Registry) Watch(ctx context.Context, every time.Duration) {
	if r == nil || r.path == "" {
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := r.Reload(); err != nil {
			if r.logger != nil {
				r.logger.Error("reloading notification destinations failed: keeping the destinations last read", "error", err)
			}
			if r.failures != nil {
				r.failures.Inc()
			}
		}
	}
}

// Config returns the destinations in force.
func (r *Registry) Config() *Config {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cfg
}

// Destinations returns tenant's destinations in force.
func (r *Registry) Destinations(tenant string) []Destination {
	return r.Config().Destinations(tenant)
}

// Destination returns tenant's destination called name, if in force.
func (r *Registry) Destination(tenant, name string) (Destination, bool) {
	return r.Config().Destination(tenant, name)
}
