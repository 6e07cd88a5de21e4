package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"time"
)

// The headers of a webhook's POST.
const (
	// HeaderEvent is "batch.<outcome>".
	HeaderEvent = "X-Fleet-Event"
	// HeaderIdempotencyKey is the notification's IdempotencyKey.
	HeaderIdempotencyKey = "X-Fleet-Idempotency-Key"
	// HeaderTimestamp is the signing time, in unix seconds.
	HeaderTimestamp = "X-Fleet-Timestamp"
	// HeaderSignature is "sha256=" + hex(HMAC-SHA256(secret, timestamp + "." + body)).
	HeaderSignature = "X-Fleet-Signature"
)

// MaxFutureSkew is how far in the future Verify accepts a timestamp (the
// sender's clock may run ahead of the receiver's).
const MaxFutureSkew = time.Minute

// Errors of Verify.
var (
	ErrBadTimestamp     = errors.New("notify: the timestamp is not unix seconds")
	ErrSignatureExpired = errors.New("notify: the signature is too old (or too far in the future)")
	ErrBadSignature     = errors.New("notify: the signature does not match the body")
)

// Sign returns the signature and timestamp headers of body signed with
// secret at t: "sha256=" + hex(HMAC-SHA256(secret, timestamp + "." + body))
// and the unix seconds of t, the scheme of the door's signed imports
// (uploads.Sign).
func Sign(secret, body []byte, t time.Time) (sig, ts string) {
	ts = strconv.FormatInt(t.Unix(), 10)
	return signature(secret, body, ts), ts
}

func signature(secret, body []byte, ts string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Verify checks a webhook's signature, for receivers: sig and ts are the
// X-Fleet-Signature and X-Fleet-Timestamp headers and body the raw request
// body (before any JSON decoding). A timestamp older than maxAge, or more
// than MaxFutureSkew after now, is ErrSignatureExpired, so a captured
// request cannot be replayed later (receivers also drop repeats by the
// idempotency key); a signature that does not match is ErrBadSignature.
// The comparison is constant-time.
func Verify(secret, body []byte, sig, ts string, maxAge time.Duration, now time.Time) error {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrBadTimestamp
	}
	age := now.Sub(time.Unix(sec, 0))
	if age > maxAge || age < -MaxFutureSkew {
		return ErrSignatureExpired
	}
	if !hmac.Equal([]byte(sig), []byte(signature(secret, body, ts))) {
		return ErrBadSignature
	}
	return nil
}
