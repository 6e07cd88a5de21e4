package main

import (
	"errors"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/uploads"
)

// tokenCmd groups the token commands: tenant tokens and operator tokens.
type tokenCmd struct {
	Mint mintTokenCmd `cmd:"" help:"Make a new tenant token: prints it once, with the line of enqueue serve's --tenant-tokens-file that names it (its SHA-256, never the token). Give the token to the tenant and add the line to the file; remove the line to revoke it."`
	// Operator tokens (cmd/enqueue/audit.go).
	Operator operatorTokenCmd `cmd:"" help:"Make a new operator token for --name: prints it once, with the line of enqueue serve's --operator-token-file that names it (its SHA-256, never the token). Give the token to the operator and add the line; remove the line to revoke it. The name is who acts in the operators' audit."`
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
