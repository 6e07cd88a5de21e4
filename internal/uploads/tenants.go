package uploads

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
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
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", "", err
	}
	token = TenantTokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
	return token, TenantTokenLine(tenant, token), nil
}

// TenantTokenLine is the tokens file's line for tenant's token.
func TenantTokenLine(tenant, token string) string {
	sum := sha256.Sum256([]byte(token))
	return tenant + " " + tenantTokenHashPrefix + hex.EncodeToString(sum[:])
}

// tenantToken is one entry of the tokens file.
type tenantToken struct {
	hash   [sha256.Size]byte
	tenant string
}

// ParseTenantTokens reads a tokens file: one entry per line, "<tenant id>
// sha256:<64 hex digits>" (the SHA-256 of the token), blank lines and lines
// starting with # skipped. A tenant may have several tokens (rotation: the
// new one is added, the old one removed once unused); a hash may appear
// once. An error names the line and why, never the line's content (it
// could be a token pasted by mistake).
func ParseTenantTokens(raw []byte) ([]tenantToken, error) {
	var (
		out  []tenantToken
		seen = map[[sha256.Size]byte]int{}
		sc   = bufio.NewScanner(bytes.NewReader(raw))
		n    int
	)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: want \"<tenant id> sha256:<hex>\" (%d fields)", n, len(fields))
		}
		tenant, h := fields[0], fields[1]
		if err := batch.ValidateTenantID(tenant); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		hexSum, ok := strings.CutPrefix(h, tenantTokenHashPrefix)
		if !ok {
			return nil, fmt.Errorf("line %d: the second field must be sha256:<hex of the token's SHA-256>, not a token (enqueue token mint prints the line)", n)
		}
		sum, err := hex.DecodeString(hexSum)
		if err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("line %d: sha256: wants 64 hex digits", n)
		}
		e := tenantToken{tenant: tenant}
		copy(e.hash[:], sum)
		if first, dup := seen[e.hash]; dup {
			return nil, fmt.Errorf("line %d: the same token hash as line %d", n, first)
		}
		seen[e.hash] = n
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n+1, err)
	}
	return out, nil
}

// TenantTokens are the tenant tokens of a tokens file, reloaded when the
// file changes (Watch): a token added to the file works, and one removed
// stops working, within the reload interval, without a restart. A file
// that no longer parses keeps the tokens last read (logged, counted). The
// zero value knows no token.
type TenantTokens struct {
	logger *slog.Logger
	file   *reloadfile.File[[]tenantToken]
}

// LoadTenantTokens reads the tokens file at path. An unreadable or invalid
// file is an error: a door does not start without the tokens it was told
// to accept.
func LoadTenantTokens(path string, logger *slog.Logger) (*TenantTokens, error) {
	parse := func(raw []byte) ([]tenantToken, error) {
		entries, err := ParseTenantTokens(raw)
		if err != nil {
			return nil, fmt.Errorf("tenant tokens file %s: %w", path, err)
		}
		return entries, nil
	}
	loaded := func(entries []tenantToken) {
		tenants := map[string]bool{}
		for _, e := range entries {
			tenants[e.tenant] = true
		}
		if logger != nil {
			logger.Info("tenant tokens loaded", "path", path, "tokens", len(entries), "tenants", len(tenants))
		}
	}
	t := &TenantTokens{logger: logger, file: reloadfile.New(path, "tenant tokens file", nil, parse, loaded)}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the file again and, if it changed and parses, replaces the
// tokens. It returns the error of a file that cannot be read or parsed,
// keeping the tokens it had.
func (t *TenantTokens) Reload() error {
	return t.file.Reload()
}

// Watch reloads the file every interval until ctx ends (Kubernetes
// updates a mounted Secret by swapping a symlink: reading the file again
// sees it, where a watch on the old inode would not), calling failed, if
// not nil, after a reload that could not read or parse it.
func (t *TenantTokens) Watch(ctx context.Context, every time.Duration, failed func()) {
	t.file.Watch(ctx, every, func(err error) {
		if t.logger != nil {
			t.logger.Error("reloading tenant tokens failed: keeping the tokens last read", "error", err)
		}
		if failed != nil {
			failed()
		}
	})
}

// Tenant returns the tenant whose token token is, comparing its SHA-256
// with every entry in constant time.
func (t *TenantTokens) Tenant(token string) (string, bool) {
	if t == nil || token == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	found := ""
	for _, e := range t.file.Current() {
		if subtle.ConstantTimeCompare(sum[:], e.hash[:]) == 1 {
			found = e.tenant
		}
	}
	return found, found != ""
}
