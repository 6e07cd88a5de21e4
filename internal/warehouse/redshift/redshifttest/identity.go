package redshifttest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Identity is a database user of the warehouse, as the Data API derives it
// from a submission's credentials (see Options.Identities).
type Identity struct {
	// User is the database user's name: the secret's user, the DbUser,
	// or the IAM-derived IAM:… / IAMR:… user.
	User string
	// Owner runs the submission as the warehouse's owner (the identity
	// that migrates: it creates the schema, tables and roles).
	Owner bool
	// Roles are the Redshift database roles the user holds (granted with
	// GRANT ROLE, or, on Serverless, named by the caller's
	// RedshiftDbRoles principal tag). Roles a migration has not created
	// yet are ignored.
	Roles []string
}

// IdentityKey names the credentials of a submission: "secret:<SecretArn>",
// "dbuser:<DbUser>", or, for a user derived from the caller's IAM identity,
// "iam:<access key id>" (the client's AWS credentials).
func IdentityKey(secretARN, dbUser, accessKeyID string) string {
	switch {
	case secretARN != "":
		return "secret:" + secretARN
	case dbUser != "":
		return "dbuser:" + dbUser
	}
	return "iam:" + accessKeyID
}

// credentialPattern finds the access key id in a SigV4 Authorization
// header.
var credentialPattern = regexp.MustCompile(`Credential=([^/,\s]+)/`)

func accessKeyID(r *http.Request) string {
	m := credentialPattern.FindStringSubmatch(r.Header.Get("Authorization"))
	if m == nil {
		return ""
	}
	return m[1]
}

// newRolePrefix returns a prefix for the PostgreSQL roles of one double:
// PostgreSQL roles are global to the server, the double's database is its
// own.
func newRolePrefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "rs" + hex.EncodeToString(b) + "_"
}

// Role statements, rewritten onto the double's prefixed PostgreSQL roles.
var (
	createRole = regexp.MustCompile(`(?i)\bCREATE\s+ROLE\s+([A-Za-z_][A-Za-z0-9_]*)`)
	toRole     = regexp.MustCompile(`(?i)\bTO\s+ROLE\s+([A-Za-z_][A-Za-z0-9_]*)`)
)

// rewriteRoles maps CREATE ROLE r and GRANT … TO ROLE r onto the double's
// prefixed roles.
func (d *Double) rewriteRoles(sql string) string {
	return outsideLiterals(sql, func(code string) string {
		code = createRole.ReplaceAllString(code, "CREATE ROLE "+d.rolePrefix+"${1} NOLOGIN")
		return toRole.ReplaceAllString(code, "TO "+d.rolePrefix+"${1}")
	})
}

// pgUser returns the PostgreSQL role a database user runs as: created
// without privileges or login, a member of the prefixed roles of id.Roles
// that exist.
func (d *Double) pgUser(ctx context.Context, id Identity) (string, error) {
	h := sha256.Sum256([]byte(id.User))
	name := d.rolePrefix + "u" + hex.EncodeToString(h[:6])
	d.provision.Lock()
	defer d.provision.Unlock()
	d.mu.Lock()
	created := d.users[name]
	d.mu.Unlock()
	if !created {
		if _, err := d.Pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{name}.Sanitize()+` NOLOGIN`); err != nil && !strings.Contains(err.Error(), "already exists") {
			return "", err
		}
		d.mu.Lock()
		d.users[name] = true
		d.mu.Unlock()
	}
	for _, r := range id.Roles {
		role := d.rolePrefix + strings.ToLower(r)
		var exists bool
		if err := d.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
			return "", err
		}
		if exists {
			if _, err := d.Pool.Exec(ctx, `GRANT `+pgx.Identifier{role}.Sanitize()+` TO `+pgx.Identifier{name}.Sanitize()); err != nil {
				return "", err
			}
		}
	}
	return name, nil
}

// dropRoles drops every PostgreSQL role of this double, best effort.
func (d *Double) dropRoles() {
	ctx := context.Background()
	rows, err := d.Pool.Query(ctx, `SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1)`, d.rolePrefix)
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, n := range names {
		id := pgx.Identifier{n}.Sanitize()
		_, _ = d.Pool.Exec(ctx, `DROP OWNED BY `+id)
	}
	for _, n := range names {
		_, _ = d.Pool.Exec(ctx, `DROP ROLE IF EXISTS `+pgx.Identifier{n}.Sanitize())
	}
}

// identityOf resolves a submission's identity; the zero Identity with
// Owner set when the double does not model identities.
func (d *Double) identityOf(key string) (Identity, error) {
	if d.opts.Identities == nil {
		return Identity{Owner: true}, nil
	}
	id, ok := d.opts.Identities[key]
	if !ok {
		return Identity{}, &apiError{http.StatusBadRequest, "ValidationException", fmt.Sprintf("no database user for the caller's credentials (%s)", strings.SplitN(key, ":", 2)[0])}
	}
	return id, nil
}
