package uploads

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// SecretValues are the current values of one credential: every one is
// accepted, several during a rotation (old and new). enqueue serve's are
// files read again every --secrets-reload (reloadfile.Secrets), which fail
// closed: while a file cannot be read, or holds no value, Current returns
// none and the credential opens nothing.
type SecretValues interface {
	// Current returns the values in force; callers do not change them.
	Current() [][]byte
}

// FixedSecret is a credential of one value that never changes (a value
// given in the environment).
type FixedSecret []byte

// Current returns the value.
func (f FixedSecret) Current() [][]byte { return [][]byte{f} }

// importTokens are the import tokens in force: Config.ImportTokens, or
// Config.AuthToken alone, or none (nil) when neither is set.
func (c Config) importTokens() SecretValues {
	switch {
	case c.ImportTokens != nil:
		return c.ImportTokens
	case c.AuthToken != "":
		return FixedSecret(c.AuthToken)
	}
	return nil
}

// hmacSecrets are the HMAC secrets in force: Config.HMACSecrets, or
// Config.HMACSecret alone, or none (nil) when neither is set.
func (c Config) hmacSecrets() SecretValues {
	switch {
	case c.HMACSecrets != nil:
		return c.HMACSecrets
	case len(c.HMACSecret) > 0:
		return FixedSecret(c.HMACSecret)
	}
	return nil
}

// currentValues are the values of set in force (none for a nil set).
func currentValues(set SecretValues) [][]byte {
	if set == nil {
		return nil
	}
	return set.Current()
}

// anyTokenEqual reports whether got is one of the values of set, compared
// as tokenEqual does, with every value (no early exit on a match).
func anyTokenEqual(got string, set SecretValues) bool {
	found := false
	for _, v := range currentValues(set) {
		if tokenEqual(got, string(v)) {
			found = true
		}
	}
	return found
}

// isImportToken reports whether token is one of the import tokens in
// force.
func (s *Server) isImportToken(token string) bool {
	return anyTokenEqual(token, s.cfg.ImportTokens)
}

// hmacSignatureOK reports whether sig is the signature of ts "." body by
// one of the HMAC secrets in force, checking every one.
func (s *Server) hmacSignatureOK(sig, ts string, body []byte) bool {
	ok := false
	for _, secret := range currentValues(s.cfg.HMACSecrets) {
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(ts + "."))
		mac.Write(body)
		want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
		if hmac.Equal([]byte(sig), []byte(want)) {
			ok = true
		}
	}
	return ok
}
