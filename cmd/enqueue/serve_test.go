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
)

// TestServeChecksEverySettingBeforeStarting: enqueue serve refuses a bad
// setting with invalid_input naming it and exit 2 before it connects to
// the database or starts anything (the database here does not answer: had
// it tried, it would exit 1). An operator token equal to the import token
// would give every notification sender the operator routes: refused too.
func TestServeChecksEverySettingBeforeStarting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	importToken := file("token", "import-token-1\n")
	sameToken := file("same", "import-token-1")
	operatorToken := file("operator", "operator-token-2\n")
	hmacSecret := file("hmac", "operator-token-2")
	empty := file("empty", " \n")
	operatorAmongImport := file("both", "import-token-1\n# rotation\noperator-token-2\n")
	const unreachable = "postgres://postgres@127.0.0.1:1/nowhere?connect_timeout=1"
	base := []string{"serve", "--listen", "127.0.0.1:0", "--auth-token-file", importToken, "--operator-token-file", operatorToken}

	for name, tc := range map[string]struct {
		args  []string
		field string
		says  string
	}{
		"operator token is the import token": {[]string{"serve", "--listen", "127.0.0.1:0", "--auth-token-file", importToken, "--operator-token-file", sameToken}, "operator_token_file", "must differ from the import token"},
		"operator token is the HMAC secret":  {append(base, "--hmac-secret-file", hmacSecret), "operator_token_file", "must differ from the HMAC secret"},
		"empty operator token file":          {[]string{"serve", "--auth-token-file", importToken, "--operator-token-file", empty}, "operator_token_file", "holds no operator token"},
		"missing operator token file":        {[]string{"serve", "--auth-token-file", importToken, "--operator-token-file", filepath.Join(dir, "nope")}, "operator_token_file", "no such file"},
		"no import token":                    {[]string{"serve", "--operator-token-file", operatorToken}, "auth_token_file", "refusing to serve without authentication"},
		"empty import token file":            {[]string{"serve", "--auth-token-file", empty}, "auth_token_file", "holds no value"},
		"operator token among import tokens": {[]string{"serve", "--auth-token-file", operatorAmongImport, "--operator-token-file", operatorToken}, "operator_token_file", "must differ from the import token"},
		"missing HMAC secret file":           {append(base, "--hmac-secret-file", filepath.Join(dir, "nope")), "hmac_secret_file", "no such file"},
		"secrets reload":                     {append(base, "--secrets-reload", "0s"), "secrets_reload", "positive"},
		"max-http-conns":                     {append(base, "--max-http-conns", "0"), "max_http_conns", "at least 1"},
		"max-conns":                          {append(base, "--max-conns", "0"), "max_conns", "at least 1"},
		"timeout":                            {append(base, "--timeout", "0s"), "timeout", "positive"},
		"path pattern":                       {append(base, "--path-pattern", "tenants/{tenant_id}/"), "path_pattern", "{tenant_database}"},
		"marker":                             {append(base, "--marker", "a/_SUCCESS"), "marker", "object name"},
		"SNS topic":                          {append(base, "--sns-topic-arn", "fleet-uploads"), "sns_topic_arn", "not an SNS topic ARN"},
		"SNS auto-confirm without a topic":   {append(base, "--sns-auto-confirm"), "sns_auto_confirm", "needs --sns-topic-arn"},
		"operator database without a token":  {[]string{"serve", "--auth-token-file", importToken, "--operator-database-url", "postgres://op@127.0.0.1:1/x"}, "operator_database_url", "needs --operator-token-file"},
		"operator database URL unparsable":   {append(base, "--operator-database-url", "postgres://op:operator-token-2@127.0.0.1:notaport/x"), "operator_database_url", "invalid database URL"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(tc.args, "--database-url", unreachable), &stdout, &stderr)
		require.Equal(t, cli.ExitInvalidInput, code, "%s: %s", name, stderr.String())
		var out map[string]string
		require.NoError(t, json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &out), "%s: %q", name, stdout.String())
		require.Equal(t, "invalid_input", out["outcome"], name)
		require.Equal(t, tc.field, out["field"], "%s: %s", name, out["error"])
		require.Contains(t, out["error"], tc.says, name)
		require.NotContains(t, stderr.String(), "unreachable", "%s: nothing connected", name)
		for _, secret := range []string{"import-token-1", "operator-token-2"} {
			require.False(t, strings.Contains(stdout.String()+stderr.String(), secret), "%s: no secret in the output", name)
		}
	}
}
