package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/reloadfile"
	"github.com/fleet/ingest/internal/uploads"
)

// loadSecrets reads the file of credential values named by the flag field
// (auth_token_file, hmac_secret_file), or returns nil without one. A file
// that cannot be read or holds no value is refused as the flag's
// invalid_input (exit 2): serve does not start without a credential it
// was told to accept. Values are never logged; their number is.
func loadSecrets(e *cli.Env, path, field string) (*reloadfile.Secrets, error) {
	if path == "" {
		return nil, nil
	}
	flag := "--" + strings.ReplaceAll(field, "_", "-")
	set, err := reloadfile.LoadSecrets(path, flag, func(values int) {
		e.Logger.Info("credential file loaded", "file", field, "path", path, "values", values)
	})
	if err != nil {
		return nil, refuseSetting(e, field, err)
	}
	return set, nil
}

// watchSecrets reads the credential files of cfg again every interval
// until ctx ends: a value added is accepted, a value removed is refused,
// without a restart. A reload that cannot read a file, or finds no value
// in it, leaves that credential without a value (nothing it guards is
// accepted): it is logged and counted in
// ingest_secret_file_reload_failures_total{file}, which
// FleetIngestDoorSecretFileInvalid watches.
func watchSecrets(ctx context.Context, cfg uploads.Config, every time.Duration, e *cli.Env) {
	for field, set := range map[string]uploads.SecretValues{"auth_token_file": cfg.ImportTokens, "hmac_secret_file": cfg.HMACSecrets} {
		file, ok := set.(*reloadfile.Secrets)
		if !ok { // not configured, or a fixed value from the environment
			continue
		}
		failures := cfg.Metrics.SecretFileReloadFailures.WithLabelValues(field)
		go file.Watch(ctx, every, func(err error) {
			failures.Inc()
			e.Logger.Error(fmt.Sprintf("reloading --%s failed: none of its values is accepted until it reads", strings.ReplaceAll(field, "_", "-")),
				"file", field, "error", err)
		})
	}
}
