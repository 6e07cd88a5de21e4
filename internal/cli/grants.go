package cli

import (
	"context"
	"errors"
	"time"

	"github.com/fleet/ingest/internal/grants"
)

// ExitMissingGrants is the exit code of a process whose database login lacks
// privileges deploy/postgres/roles.sql grants its role (RequireGrants).
const ExitMissingGrants = 10

// GrantsTimeoutDefault bounds RequireGrants' queries.
const GrantsTimeoutDefault = 10 * time.Second

// RequireGrants checks at start that the login of q holds what
// deploy/postgres/roles.sql grants role (grants.Check). Missing privileges
// are logged, every one named, with the remedy (re-run roles.sql), and
// returned as ExitError{Code: ExitMissingGrants}: the process does not start
// and meet "permission denied" later, in the middle of a batch. A check
// that cannot run (the database's error) is returned as it is.
func RequireGrants(ctx context.Context, e *Env, q grants.Querier, role grants.Role) error {
	ctx, cancel := context.WithTimeout(ctx, GrantsTimeoutDefault)
	defer cancel()
	err := grants.Check(ctx, q, role)
	var missing *grants.MissingError
	if errors.As(err, &missing) {
		e.Logger.Error("not starting: the database login lacks grants of deploy/postgres/roles.sql",
			"role", string(missing.Role), "login", missing.Login, "missing", missing.Names(), "error", missing.Error())
		return ExitError{Code: ExitMissingGrants, Err: missing}
	}
	return err
}
