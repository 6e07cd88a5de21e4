package uploads

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/reloadfile"
)

// TenantTokenPrefix starts every tenant token MintTenantToken makes, so
// that one found in a log or a paste is recognisable (and a secret
// scanner can look for it).
const TenantTokenPrefix = "fit_"

// tenantTokenHashPrefix starts the hash of a tenant token in the tokens
// file: the file holds hashes, never tokens.
const tenantTokenHashPrefix = "sha256:"

// TenantTokensReloadDefault is how often the tokens file is checked for a
// change (enqueue serve --tenant-tokens-reload).
const TenantTokensReloadDefault = 10 * time.Second

// MintTenantToken returns a new tenant token (TenantTokenPrefix and 32
// random bytes, base64url) and the line of the tokens file that names it
// for tenant: "<tenant id> sha256:<hex of the token's SHA-256>". Only the
// line goes into the file; the token goes to the tenant.
func MintTenantToken(tenant string) (token, line string, err error) {
	if err := batch.ValidateTenantID(tenant); err != nil {
		return "", "", err
	}
	return mintNamedToken(TenantTokenPrefix, tenant)
}

// TenantTokenLine is the tokens file's line for tenant's token.
func TenantTokenLine(tenant, token string) string { return namedTokenLine(tenant, token) }

// mintNamedToken returns a new token (prefix and 32 random bytes,
// base64url) and its line of a tokens file naming owner: the one way
// tenant and operator tokens are made.
func mintNamedToken(prefix, owner string) (token, line string, err error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", "", err
	}
	token = prefix + base64.RawURLEncoding.EncodeToString(raw)
	return token, namedTokenLine(owner, token), nil
}

// namedTokenLine is a tokens file's line for owner's token: "<owner>
// sha256:<hex of the token's SHA-256>".
func namedTokenLine(owner, token string) string {
	sum := sha256.Sum256([]byte(token))
	return owner + " " + tenantTokenHashPrefix + hex.EncodeToString(sum[:])
}

// tenantToken is one entry of the tokens file.
type tenantToken struct {
	hash   [sha256.Size]byte
	tenant string
}

// RefusedLine is a line of a tokens file that is not applied: its number
// and why, never its content (it could be a token pasted by mistake).
type RefusedLine struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

func (r RefusedLine) String() string { return fmt.Sprintf("line %d: %s", r.Line, r.Reason) }

// tenantTokenSet is what a tokens file grants: the entries of its lines
// that parse, and the lines refused.
type tenantTokenSet struct {
	entries []tenantToken
	refused []RefusedLine
}

// TenantTokensCheck is what a tokens file holds (enqueue token check): the
// tokens and tenants of the lines that are applied, and the lines refused.
type TenantTokensCheck struct {
	Tokens  int           `json:"tokens"`
	Tenants int           `json:"tenants"`
	Refused []RefusedLine `json:"refused_lines"`
}

// CheckTenantTokens reads a tokens file as enqueue serve applies it (see
// parseTenantTokens).
func CheckTenantTokens(raw []byte) TenantTokensCheck {
	set := parseTenantTokens(raw)
	return TenantTokensCheck{Tokens: len(set.entries), Tenants: set.tenants(), Refused: set.refused}
}

func (s tenantTokenSet) tenants() int {
	tenants := map[string]bool{}
	for _, e := range s.entries {
		tenants[e.tenant] = true
	}
	return len(tenants)
}

// parseTenantTokens reads a tokens file line by line: one entry per line,
// "<tenant id> sha256:<64 hex digits>" (the SHA-256 of the token), blank
// lines and lines starting with # skipped. A tenant may have several
// tokens (rotation: the new one is added, the old one removed once
// unused). Each line stands alone: a line that does not parse is refused
// (its token, if any, is not accepted) and the others are applied, so an
// edit that removes one line and garbles another still removes the first.
// A hash given again for the same tenant is refused (the first line
// stands); a hash given for two tenants is ambiguous, and every line of it
// is refused. A refusal names the line and why, never its content.
func parseTenantTokens(raw []byte) tenantTokenSet {
	type first struct {
		line   int
		tenant string
	}
	type candidate struct {
		line  int
		entry tenantToken
	}
	var (
		set        tenantTokenSet
		candidates []candidate
		seen       = map[[sha256.Size]byte]first{}
		ambiguous  = map[[sha256.Size]byte]bool{}
	)
	for i, line := range strings.Split(string(raw), "\n") {
		n := i + 1
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, why := parseTenantTokenLine(line)
		if why != "" {
			set.refused = append(set.refused, RefusedLine{Line: n, Reason: why})
			continue
		}
		if f, dup := seen[e.hash]; dup {
			why := fmt.Sprintf("the same token hash as line %d", f.line)
			if f.tenant != e.tenant {
				ambiguous[e.hash] = true
				why += ", for another tenant: neither line is applied"
			}
			set.refused = append(set.refused, RefusedLine{Line: n, Reason: why})
			continue
		}
		seen[e.hash] = first{line: n, tenant: e.tenant}
		candidates = append(candidates, candidate{line: n, entry: e})
	}
	for _, c := range candidates {
		if ambiguous[c.entry.hash] {
			set.refused = append(set.refused, RefusedLine{Line: c.line, Reason: "the same token hash as a later line for another tenant: neither line is applied"})
			continue
		}
		set.entries = append(set.entries, c.entry)
	}
	slices.SortFunc(set.refused, func(a, b RefusedLine) int { return a.Line - b.Line })
	return set
}

// parseTenantTokenLine parses one line of a tokens file, or says why not
// (never quoting it).
func parseTenantTokenLine(line string) (tenantToken, string) {
	fields := strings.Fields(line)
	if len(fields) != 2 {
		return tenantToken{}, fmt.Sprintf("want \"<tenant id> sha256:<hex>\" (%d fields)", len(fields))
	}
	tenant, h := fields[0], fields[1]
	if err := batch.ValidateTenantID(tenant); err != nil {
		return tenantToken{}, err.Error()
	}
	hexSum, ok := strings.CutPrefix(h, tenantTokenHashPrefix)
	if !ok {
		return tenantToken{}, "the second field must be sha256:<hex of the token's SHA-256>, not a token (enqueue token mint prints the line)"
	}
	sum, err := hex.DecodeString(hexSum)
	if err != nil || len(sum) != sha256.Size {
		return tenantToken{}, "sha256: wants 64 hex digits"
	}
	e := tenantToken{tenant: tenant}
	copy(e.hash[:], sum)
	return e, ""
}

// RefusedLinesError is the error of a tokens file some lines of which are
// refused; the other lines are in force.
type RefusedLinesError struct {
	Path  string
	Lines []RefusedLine
}

func (e *RefusedLinesError) Error() string {
	parts := make([]string, len(e.Lines))
	for i, l := range e.Lines {
		parts[i] = l.String()
	}
	return fmt.Sprintf("tenant tokens file %s: %d line(s) refused, their tokens are not accepted: %s", e.Path, len(e.Lines), strings.Join(parts, "; "))
}

// TenantTokens are the tenant tokens of a tokens file, reloaded when the
// file changes (Watch): a token added to the file works, and one removed
// stops working, within the reload interval, without a restart. They fail
// closed: the file is applied line by line (a line that does not parse is
// refused, reported by number, and the others are in force), and a file
// that cannot be read (deleted, unreadable) grants no token at all, never
// the tokens last read. The zero value knows no token.
type TenantTokens struct {
	logger *slog.Logger
	file   *reloadfile.File[tenantTokenSet]
}

// LoadTenantTokens reads the tokens file at path. A file that cannot be
// read is an error: a door does not start without the tokens it was told
// to accept. Refused lines are not: they are logged, the other lines are
// in force, and RefusedLines counts them.
func LoadTenantTokens(path string, logger *slog.Logger) (*TenantTokens, error) {
	parse := func(raw []byte) (tenantTokenSet, error) {
		set := parseTenantTokens(raw)
		if len(set.refused) > 0 {
			return set, &RefusedLinesError{Path: path, Lines: set.refused}
		}
		return set, nil
	}
	loaded := func(set tenantTokenSet) {
		if logger != nil {
			logger.Info("tenant tokens loaded", "path", path, "tokens", len(set.entries), "tenants", set.tenants(), "refused_lines", len(set.refused))
		}
	}
	t := &TenantTokens{logger: logger, file: reloadfile.NewFailClosed(path, "tenant tokens file", tenantTokenSet{}, parse, loaded)}
	err := t.Reload()
	var refused *RefusedLinesError
	switch {
	case errors.As(err, &refused):
		if logger != nil {
			logger.Error("tenant tokens file: lines refused", "error", err)
		}
	case err != nil:
		return nil, err
	}
	return t, nil
}

// Reload reads the file again and applies it: the lines that parse are
// the tokens in force. It returns a *RefusedLinesError for a file with
// refused lines (at every reload while it is unchanged), or the error of a
// file that cannot be read, and then no token is in force.
func (t *TenantTokens) Reload() error {
	return t.file.Reload()
}

// RefusedLines is the number of lines of the file in force that are
// refused (0 while the file cannot be read: then no line is in force).
func (t *TenantTokens) RefusedLines() int {
	if t == nil {
		return 0
	}
	return len(t.file.Current().refused)
}

// Watch reloads the file every interval until ctx ends (Kubernetes
// updates a mounted Secret by swapping a symlink: reading the file again
// sees it, where a watch on the old inode would not). It calls reloaded,
// if not nil, once at once and after every reload, with the lines refused
// in force and the reload's error (nil at once): a file with refused lines
// or one that cannot be read is an error at every reload until fixed, and
// is logged.
func (t *TenantTokens) Watch(ctx context.Context, every time.Duration, reloaded func(refusedLines int, err error)) {
	if reloaded != nil {
		reloaded(t.RefusedLines(), nil)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := t.Reload()
		if err != nil && t.logger != nil {
			var refused *RefusedLinesError
			if errors.As(err, &refused) {
				t.logger.Error("reloading tenant tokens: lines refused, the others are in force", "error", err)
			} else {
				t.logger.Error("reloading tenant tokens failed: no tenant token is accepted until the file reads", "error", err)
			}
		}
		if reloaded != nil {
			reloaded(t.RefusedLines(), err)
		}
	}
}

// Tenant returns the tenant whose token token is, comparing its SHA-256
// with every entry in constant time.
func (t *TenantTokens) Tenant(token string) (string, bool) {
	if t == nil || token == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	found := ""
	for _, e := range t.file.Current().entries {
		if subtle.ConstantTimeCompare(sum[:], e.hash[:]) == 1 {
			found = e.tenant
		}
	}
	return found, found != ""
}
