package uploads

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// Operator tokens: the credentials of the operator surfaces (the cancel
// route, the River UI, pprof), each carrying the name of the operator who
// holds it. The operator tokens file (enqueue serve --operator-token-file)
// names them as the tenant tokens file names tenants' tokens, one per
// line, "<operator name> sha256:<hex of the token's SHA-256>": it holds
// hashes, never tokens. An operator may have several tokens (rotation: add
// the new line, hand the new token over, remove the old line). The name
// is who acts in the operators' audit (internal/audit): from the
// credential, never from a header.
//
// The file is read again every --operator-tokens-reload and applied line
// by line: a malformed line is refused and reported by its number (never
// its content: it could be a token pasted by mistake) while the others
// apply, a line removed stops working at the next reload whatever else is
// wrong, and a file that is missing or unreadable means no operator token
// at all (the surfaces answer 401), never the tokens read last.
//
// The former format, a file holding the one shared token itself, is still
// read: its token is operator LegacyOperatorName, with a deprecation
// warning at every load.

// OperatorTokenPrefix starts every operator token MintOperatorToken makes.
const OperatorTokenPrefix = "fop_"

// LegacyOperatorName is the operator of a token given the former way: a
// file holding the token itself, or ENQUEUE_OPERATOR_TOKEN.
const LegacyOperatorName = "operator"

// OperatorTokensReloadDefault is how often the operator tokens file is
// read again (enqueue serve --operator-tokens-reload).
const OperatorTokensReloadDefault = 10 * time.Second

// maxOperatorNameLen bounds an operator's name.
const maxOperatorNameLen = 64

// ValidateOperatorName checks an operator's name: 1 to 64 letters, digits
// and . _ @ -.
func ValidateOperatorName(name string) error {
	if name == "" || len(name) > maxOperatorNameLen {
		return fmt.Errorf("an operator name has 1 to %d characters", maxOperatorNameLen)
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '@', r == '-':
		default:
			return errors.New("an operator name has only letters, digits and . _ @ -")
		}
	}
	return nil
}

// MintOperatorToken returns a new operator token for name
// (OperatorTokenPrefix and 32 random bytes, base64url) and its line of the
// operator tokens file.
func MintOperatorToken(name string) (token, line string, err error) {
	if err := ValidateOperatorName(name); err != nil {
		return "", "", err
	}
	return mintNamedToken(OperatorTokenPrefix, name)
}

// OperatorTokenLine is the operator tokens file's line for name's token.
func OperatorTokenLine(name, token string) string { return namedTokenLine(name, token) }

// operatorEntry is one operator token of the file: its hash and its operator.
type operatorEntry struct {
	hash [sha256.Size]byte
	name string
}

// ParseOperatorTokens reads an operator tokens file line by line: the
// tokens of the lines that parse, and one error per line that does not
// (naming its number and why). legacy is true when the file is the former
// format (one line, the token itself): its token is LegacyOperatorName's.
func ParseOperatorTokens(raw []byte) (tokens []operatorEntry, lineErrs []error, legacy bool) {
	type line struct {
		n    int
		text string
	}
	var lines []line
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	n := 0
	for sc.Scan() {
		n++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		lines = append(lines, line{n, text})
	}
	if err := sc.Err(); err != nil {
		lineErrs = append(lineErrs, fmt.Errorf("line %d: %w", n+1, err))
	}
	if len(lines) == 1 && len(strings.Fields(lines[0].text)) == 1 && !strings.HasPrefix(lines[0].text, tenantTokenHashPrefix) {
		return []operatorEntry{{hash: sha256.Sum256([]byte(lines[0].text)), name: LegacyOperatorName}}, lineErrs, true
	}
	seen := map[[sha256.Size]byte]int{}
	for _, l := range lines {
		fields := strings.Fields(l.text)
		if len(fields) != 2 {
			lineErrs = append(lineErrs, fmt.Errorf("line %d: want \"<operator name> sha256:<hex>\" (%d fields)", l.n, len(fields)))
			continue
		}
		if err := ValidateOperatorName(fields[0]); err != nil {
			lineErrs = append(lineErrs, fmt.Errorf("line %d: %w", l.n, err))
			continue
		}
		hexSum, ok := strings.CutPrefix(fields[1], tenantTokenHashPrefix)
		sum, err := hex.DecodeString(hexSum)
		if !ok || err != nil || len(sum) != sha256.Size {
			lineErrs = append(lineErrs, fmt.Errorf("line %d: the second field must be sha256:<64 hex digits of the token's SHA-256>, not a token (enqueue token operator prints the line)", l.n))
			continue
		}
		t := operatorEntry{name: fields[0]}
		copy(t.hash[:], sum)
		if first, dup := seen[t.hash]; dup {
			lineErrs = append(lineErrs, fmt.Errorf("line %d: the same token hash as line %d", l.n, first))
			continue
		}
		seen[t.hash] = l.n
		tokens = append(tokens, t)
	}
	return tokens, lineErrs, false
}

// OperatorTokens are the operator tokens in force. Without a file (a
// token given on its own: StaticOperatorToken) they never change.
type OperatorTokens struct {
	path   string
	logger *slog.Logger

	mu     sync.RWMutex
	tokens []operatorEntry
	raw    []byte // the file as last read; nil: not read, or unreadable
}

// StaticOperatorToken returns the one operator token token, of operator
// name (ENQUEUE_OPERATOR_TOKEN is LegacyOperatorName's).
func StaticOperatorToken(name, token string) *OperatorTokens {
	return &OperatorTokens{tokens: []operatorEntry{{hash: sha256.Sum256([]byte(token)), name: name}}}
}

// LoadOperatorTokens reads the operator tokens file at path. A file that
// cannot be read, or that holds no valid token, is an error: a door does
// not start without the operator tokens it was told to accept. Malformed
// lines of a file that also holds valid ones are logged and skipped.
func LoadOperatorTokens(path string, logger *slog.Logger) (*OperatorTokens, error) {
	o := &OperatorTokens{path: path, logger: logger}
	err := o.Reload()
	if len(o.current()) == 0 {
		if err == nil {
			err = errors.New("it holds no operator token")
		}
		return nil, fmt.Errorf("operator tokens file %s: %w", path, err)
	}
	if err != nil && logger != nil {
		logger.Error("operator tokens file: refused its malformed lines, applied the rest", "path", path, "error", err)
	}
	return o, nil
}

// Reload reads the file again and applies it line by line (see the
// package's operator token rules). It returns what was wrong: the file
// unreadable (no operator token is in force), or its malformed lines.
func (o *OperatorTokens) Reload() error {
	if o == nil || o.path == "" {
		return nil
	}
	raw, err := os.ReadFile(o.path)
	if err != nil {
		o.mu.Lock()
		o.tokens, o.raw = nil, nil
		o.mu.Unlock()
		return fmt.Errorf("operator tokens file: %w (no operator token is accepted until it can be read)", err)
	}
	o.mu.RLock()
	same := o.raw != nil && bytes.Equal(raw, o.raw)
	o.mu.RUnlock()
	tokens, lineErrs, legacy := ParseOperatorTokens(raw)
	if !same {
		o.mu.Lock()
		o.tokens, o.raw = tokens, raw
		o.mu.Unlock()
		if o.logger != nil {
			names := map[string]bool{}
			for _, t := range tokens {
				names[t.name] = true
			}
			o.logger.Info("operator tokens loaded", "path", o.path, "tokens", len(tokens), "operators", len(names), "refused_lines", len(lineErrs))
			if legacy {
				o.logger.Warn("the operator token file holds a token, not \"<operator name> sha256:<hex>\" lines: deprecated; its token acts as operator \""+
					LegacyOperatorName+"\". Give each operator a token of their own (enqueue token operator --name NAME)", "path", o.path)
			}
		}
	}
	return errors.Join(lineErrs...)
}

// Watch reloads the file every interval until ctx ends (a mounted Secret
// is updated by swapping a symlink: reading the path again sees it),
// logging what was wrong and calling failed, if not nil, after a reload
// that found the file unreadable or a line malformed.
func (o *OperatorTokens) Watch(ctx context.Context, every time.Duration, failed func()) {
	if o == nil || o.path == "" {
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := o.Reload(); err != nil {
			if o.logger != nil {
				o.logger.Error("reloading operator tokens: refused what is wrong, applied the rest", "path", o.path, "error", err)
			}
			if failed != nil {
				failed()
			}
		}
	}
}

func (o *OperatorTokens) current() []operatorEntry {
	if o == nil {
		return nil
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.tokens
}

// Operator returns the operator whose token token is, comparing its
// SHA-256 with every token in force in constant time.
func (o *OperatorTokens) Operator(token string) (string, bool) {
	if token == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	found := ""
	for _, t := range o.current() {
		if subtle.ConstantTimeCompare(sum[:], t.hash[:]) == 1 {
			found = t.name
		}
	}
	return found, found != ""
}

// operatorKey is the context key of the operator a request was
// authenticated as.
type operatorKey struct{}

// OperatorOf returns the operator (the name their token carries) an
// operator route's request was authenticated as.
func OperatorOf(ctx context.Context) (string, bool) {
	name, ok := ctx.Value(operatorKey{}).(string)
	return name, ok && name != ""
}

// WithOperator returns ctx carrying the operator name, as OperatorOnly
// passes it to its handler.
func WithOperator(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, operatorKey{}, name)
}
