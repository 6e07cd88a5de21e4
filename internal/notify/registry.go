package notify

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleet/ingest/internal/reloadfile"
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
	logger   *slog.Logger
	failures prometheus.Counter
	file     *reloadfile.File[*Config]
}

// NewRegistry reads the destinations file at path ("" for none). An
// unreadable or invalid file is an error: a worker does not start without
// the destinations it was told to use. failures (may be nil) counts the
// reloads that fail afterwards (metrics.Metrics.NotificationConfigReloadFailures);
// logger (may be nil) logs every load and failed reload, never a secret.
func NewRegistry(path string, logger *slog.Logger, failures prometheus.Counter) (*Registry, error) {
	parse := func(raw []byte) (*Config, error) {
		cfg, err := Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return cfg, nil
	}
	loaded := func(cfg *Config) {
		if logger != nil {
			tenants, destinations := cfg.Counts()
			logger.Info("notification destinations loaded", "path", path, "tenants", tenants, "destinations", destinations)
		}
	}
	r := &Registry{logger: logger, failures: failures,
		file: reloadfile.New(path, "notifications file", &Config{}, parse, loaded)}
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
	return r.file.Path()
}

// Reload reads the file again and, if it changed and parses, replaces the
// destinations. It returns the error of a file that cannot be read or
// parsed, keeping the destinations it had.
func (r *Registry) Reload() error {
	if r.Path() == "" {
		return nil
	}
	return r.file.Reload()
}

// Watch reloads the file every interval until ctx ends (Kubernetes updates
// a mounted Secret by swapping a symlink: reading the path again sees the
// new file, where a watch on the old inode would not). A reload that fails
// is logged and counted, and the destinations last read stay. Without a
// file Watch returns at once.
func (r *Registry) Watch(ctx context.Context, every time.Duration) {
	if r.Path() == "" {
		return
	}
	r.file.Watch(ctx, every, func(err error) {
		if r.logger != nil {
			r.logger.Error("reloading notification destinations failed: keeping the destinations last read", "error", err)
		}
		if r.failures != nil {
			r.failures.Inc()
		}
	})
}

// Config returns the destinations in force.
func (r *Registry) Config() *Config {
	if r == nil {
		return nil
	}
	return r.file.Current()
}

// Destinations returns tenant's destinations in force.
func (r *Registry) Destinations(tenant string) []Destination {
	return r.Config().Destinations(tenant)
}

// Destination returns tenant's destination called name, if in force.
func (r *Registry) Destination(tenant, name string) (Destination, bool) {
	return r.Config().Destination(tenant, name)
}
