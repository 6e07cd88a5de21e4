package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/uploads"
)

// tokenCmd groups the token commands: tenant tokens and operator tokens.
type tokenCmd struct {
	Mint  mintTokenCmd  `cmd:"" help:"Make a new tenant token: prints it once, with the line of enqueue serve's --tenant-tokens-file that names it (its SHA-256, never the token). Give the token to the tenant and add the line to the file; remove the line to revoke it."`
	Check checkTokenCmd `cmd:"" help:"Check a tenant tokens file as enqueue serve applies it, before putting it in a Secret: prints the tokens and tenants it grants and each refused line by number and reason (never its content). Exit 0: every line applies; 1: some lines are refused (serve would refuse their tokens and FleetIngestDoorTenantTokensInvalid fire); 2: the file cannot be read."`
	// Operator tokens (cmd/enqueue/audit.go).
	Operator operatorTokenCmd `cmd:"" help:"Make a new operator token for --name: prints it once, with the line of enqueue serve's --operator-token-file that names it (its SHA-256, never the token). Give the token to the operator and add the line; remove the line to revoke it. The name is who acts in the operators' audit."`
}

type checkTokenCmd struct {
	File string `arg:"" name:"file" help:"The tenant tokens file (what --tenant-tokens-file would read)."`
}

// Run reads the file and prints {"outcome":"valid"|"invalid_lines",
// "file","tokens","tenants","refused_lines":[{"line","reason"}]}, with
// exit 0 for valid, 1 (cli.ExitInfra, the generic failure) for refused
// lines; a file that cannot be read is invalid_input, exit 2. It touches
// no database.
func (c *checkTokenCmd) Run(e *cli.Env) error {
	raw, err := os.ReadFile(c.File)
	if err != nil {
		return invalid(e, &jobs.InputError{Field: "file", Reason: err.Error()})
	}
	check := uploads.CheckTenantTokens(raw)
	if check.Refused == nil {
		check.Refused = []uploads.RefusedLine{}
	}
	outcome := "valid"
	if len(check.Refused) > 0 {
		outcome = "invalid_lines"
	}
	printJSON(e.Stdout, map[string]any{"outcome": outcome, "file": c.File, "tokens": check.Tokens, "tenants": check.Tenants, "refused_lines": check.Refused})
	if len(check.Refused) == 0 {
		return nil
	}
	for _, l := range check.Refused {
		e.Logger.Error("tenant tokens file: line refused", "file", c.File, "line", l.Line, "reason", l.Reason)
	}
	return cli.ExitError{Code: cli.ExitInfra, Err: fmt.Errorf("%s: %d line(s) refused", c.File, len(check.Refused))}
}

type mintTokenCmd struct {
	TenantID string `name:"tenant-id" required:"" help:"The tenant the token imports and reads for."`
}

// Run mints a token and prints {"outcome":"minted","tenant_id","token",
// "line"}. It touches no database: the tokens file is the door's only
// record of tenant tokens.
func (m *mintTokenCmd) Run(e *cli.Env) error {
	if err := batch.ValidateTenantID(m.TenantID); err != nil {
		in := &jobs.InputError{Field: "tenant_id", Reason: err.Error()}
		var v *batch.ValidationError
		if errors.As(err, &v) {
			in.Field, in.Reason = v.Field, v.Reason
		}
		return invalid(e, in)
	}
	token, line, err := uploads.MintTenantToken(m.TenantID)
	if err != nil {
		return err
	}
	printJSON(e.Stdout, map[string]string{"outcome": "minted", "tenant_id": m.TenantID, "token": token, "line": line})
	return nil
}
