package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fleet/ingest/internal/cli"
)

// FuzzImportFlags runs "enqueue import" with arbitrary flag values against a
// database that cannot be reached. Every input must be either refused before
// any database access (exit 2) or valid and then fail on the database (exit
// 1) — never anything else, never a panic — with exactly one JSON line on
// stdout. The seed corpus runs in every normal test run.
func FuzzImportFlags(f *testing.F) {
	f.Add("tenant-a", "tenant_db", "company-1", "s3://bucket/folder")
	f.Add("", "db", "c", "s3://bucket/f")
	f.Add("t", "db; DROP TABLE x", "c", "s3://bucket/f")
	f.Add("t", "db", "c", "s3://bucket/../etc")
	f.Add("t\n", "db", "c", "file:///tmp/x")
	f.Add("t", "db", "c", "mem://b/x?y")
	f.Add(strings.Repeat("t", 101), "db", "c", "s3://bucket/f")
	f.Add("t", "db", "c", "--help")
	f.Add("--tenant-id", "db", "c", "s3://bucket/f")
	f.Fuzz(func(t *testing.T, tenant, database, company, folder string) {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{
			"import", "--tenant-id", tenant, "--tenant-database", database, "--company-id", company, "--folder", folder,
			"--database-url", "postgres://fuzz@127.0.0.1:1/none?connect_timeout=1", "--timeout", "2s", "--log-level", "error",
		}, &stdout, &stderr)
		switch code {
		case cli.ExitInvalidInput:
			// kong's own usage errors print no JSON; ours print invalid_input.
			if out := strings.TrimSpace(stdout.String()); out != "" {
				var m map[string]any
				if err := json.Unmarshal([]byte(out), &m); err != nil || m["outcome"] != "invalid_input" {
					t.Fatalf("refusal is not one invalid_input line: %q", out)
				}
			}
		case cli.ExitInfra:
			var m map[string]any
			if err := json.Unmarshal([]byte(strings.TrimSpace(stdout.String())), &m); err != nil || m["outcome"] != "error" {
				t.Fatalf("infrastructure failure is not one error line: %q", stdout.String())
			}
		case cli.ExitOK:
			if !strings.Contains(stdout.String(), "Usage") && !strings.Contains(stdout.String(), "usage") {
				t.Fatalf("exit 0 without a database: %q", stdout.String())
			}
		default:
			t.Fatalf("exit %d for %q %q %q %q: %s", code, tenant, database, company, folder, stdout.String())
		}
	})
}
