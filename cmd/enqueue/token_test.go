package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/uploads"
)

// TestTokenCheck: enqueue token check reads a tenant tokens file as serve
// applies it: exit 0 and the tokens and tenants it grants for a valid
// file; exit 1 with every refused line by number and reason, never its
// content (a token pasted instead of its hash), for a file with bad
// lines; exit 2 for a file that cannot be read or no file argument. It
// needs no database.
func TestTokenCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokA, lineA, err := uploads.MintTenantToken("acme")
	require.NoError(t, err)
	_, lineA2, err := uploads.MintTenantToken("acme")
	require.NoError(t, err)
	_, lineB, err := uploads.MintTenantToken("globex")
	require.NoError(t, err)
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	check := func(args ...string) (int, map[string]any, string) {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"token", "check"}, args...), &stdout, &stderr)
		var out map[string]any
		require.NoError(t, json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &out), "%q %q", stdout.String(), stderr.String())
		return code, out, stdout.String() + stderr.String()
	}

	code, out, _ := check(file("good", "# tenants\n"+lineA+"\n"+lineA2+"\n\n"+lineB+"\n"))
	require.Equal(t, cli.ExitOK, code)
	require.Equal(t, "valid", out["outcome"])
	require.EqualValues(t, 3, out["tokens"])
	require.EqualValues(t, 2, out["tenants"])
	require.Empty(t, out["refused_lines"])

	// B's line removed, A's token pasted instead of its hash on line 2.
	code, out, all := check(file("bad", lineA+"\nacme "+tokA+"\n"))
	require.Equal(t, cli.ExitInfra, code, all)
	require.Equal(t, "invalid_lines", out["outcome"])
	require.EqualValues(t, 1, out["tokens"])
	refused := out["refused_lines"].([]any)
	require.Len(t, refused, 1)
	require.EqualValues(t, 2, refused[0].(map[string]any)["line"])
	require.Contains(t, refused[0].(map[string]any)["reason"], "not a token")
	require.NotContains(t, all, tokA, "a refused line's content is never printed")
	require.NotContains(t, all, strings.TrimPrefix(tokA, uploads.TenantTokenPrefix))

	code, out, _ = check(filepath.Join(dir, "missing"))
	require.Equal(t, cli.ExitInvalidInput, code)
	require.Equal(t, "invalid_input", out["outcome"])
	require.Equal(t, "file", out["field"])

	var stdout, stderr bytes.Buffer
	require.Equal(t, cli.ExitInvalidInput, run(context.Background(), []string{"token", "check"}, &stdout, &stderr), "no file: a usage error")
}
