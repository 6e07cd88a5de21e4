package folder

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// ErrUnreadableKey is wrapped by every error about an object key that this
// project does not read: one that is not valid UTF-8, holds a control
// character, or cannot be decoded from a URL-encoded listing. S3 accepts
// any Unicode key, but such a key cannot be named faithfully in XML (a
// listing page not URL-encoded is undecodable), in an object read through
// gocloud.dev/blob (which rewrites ASCII 0–31) or in operator output.
var ErrUnreadableKey = errors.New("unreadable object key")

// CheckKey returns nil when key is valid UTF-8 without a control character
// (unicode.IsControl: C0, NUL included, DEL and C1), and otherwise an error
// wrapping ErrUnreadableKey that names the key escaped (strconv.Quote) and
// says why. Invisible formatting characters are left to Canonicalize,
// which refuses them in folder names: an object key holding one can be
// listed and read.
func CheckKey(key string) error {
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrUnreadableKey, strconv.Quote(key))
	}
	for _, r := range key {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %s holds a control character (U+%04X)", ErrUnreadableKey, strconv.Quote(key), r)
		}
	}
	return nil
}

// DecodeListedKey decodes a key of a listing that asked S3 to URL-encode
// them (ListObjectsV2 with EncodingType url), and the Prefix, StartAfter
// and Delimiter it echoes. S3 encodes them as form values (a space is "+",
// a "+" is "%2B", "/" stays as it is), which url.QueryUnescape reverses;
// the AWS SDK for Go v2 hands them back as S3 wrote them, undecoded. An
// error wraps ErrUnreadableKey and names the encoded key quoted. The
// decoded key is not checked: see CheckKey.
func DecodeListedKey(encoded string) (string, error) {
	key, err := url.QueryUnescape(encoded)
	if err != nil {
		return "", fmt.Errorf("%w: the listing's URL-encoded key %s does not decode: %v", ErrUnreadableKey, strconv.Quote(encoded), err)
	}
	return key, nil
}
