package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// members is what a JSON object of a details document held beyond the keys
// this build knows: its other members, compact, as "key":value pairs
// joined by commas, in the order they came. ParseDetails keeps them in the
// object they came with and Marshal writes them back after the known keys,
// so a document written by a newer build (which may add keys within a
// version, see DetailsVersion) keeps what that build wrote through every
// write of this one. A string, so the types that hold one stay comparable.
//
// The members belong to the value they were read with: a writer that
// replaces a nested object (a new Progress sample, a new LastError) drops
// the old object's members with it, as it should, since they described the
// object it replaced.
type members string

// objectKeys describes the keys a struct type's fields are written under:
// each json tag name and the field's index.
type objectKeys struct {
	index map[string]int
	names []string
}

var keysOf sync.Map // reflect.Type → *objectKeys

func keysOfType(t reflect.Type) *objectKeys {
	if k, ok := keysOf.Load(t); ok {
		return k.(*objectKeys)
	}
	k := &objectKeys{index: map[string]int{}}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		k.index[name] = i
		k.names = append(k.names, name)
	}
	keysOf.Store(t, k)
	return k
}

// member is one member of a JSON object: its key as written (a JSON
// string, quotes included), the key decoded, and its value as written.
type member struct {
	rawKey []byte
	key    string
	value  []byte
}

// decodeObject decodes the JSON object raw into v, a pointer to a struct
// type without methods (the plain form of a details type), and returns the
// members it does not know. A key spelled exactly like a json tag of v's
// fields is decoded into that field. A key equal to one without regard to
// case ("Phase", "PHASE") is refused: encoding/json would take it for the
// field, so it is a known key misspelt, not a newer build's key, and a
// document holding it is ambiguous. A key that repeats is refused. Any
// other key is unknown to this build: it is returned, with its value, to
// be written back. A JSON null decodes to nothing, as encoding/json does
// for a struct.
func decodeObject(raw []byte, v any) (members, error) {
	if string(bytes.TrimSpace(raw)) == "null" {
		return "", nil
	}
	ms, err := splitObject(raw)
	if err != nil {
		return "", err
	}
	return decodeMembers(raw, ms, v)
}

// decodeMembers is decodeObject of raw split into ms.
func decodeMembers(raw []byte, ms []member, v any) (members, error) {
	keys := keysOfType(reflect.TypeOf(v).Elem())
	var rest []byte
	seen := make(map[string]bool, len(ms))
	for _, m := range ms {
		if seen[m.key] {
			return "", fmt.Errorf("key %q repeated", m.key)
		}
		seen[m.key] = true
		if _, ok := keys.index[m.key]; ok {
			continue
		}
		for _, known := range keys.names {
			if strings.EqualFold(m.key, known) {
				return "", fmt.Errorf("key %q is the key %q spelt in another case", m.key, known)
			}
		}
		if len(rest) > 0 {
			rest = append(rest, ',')
		}
		rest = append(rest, m.rawKey...)
		rest = append(rest, ':')
		var compact bytes.Buffer
		if err := json.Compact(&compact, m.value); err != nil {
			return "", fmt.Errorf("%s: %w", m.key, err)
		}
		rest = append(rest, compact.Bytes()...)
	}
	// The known keys, exactly spelt and each once (encoding/json ignores
	// the others, and no other key can be taken for one of them now).
	if err := json.Unmarshal(raw, v); err != nil {
		return "", err
	}
	return members(rest), nil
}

// splitObject splits the JSON object raw into its members, in order,
// without decoding their values. It reads raw as JSON only as far as it
// needs to find the members' bounds: callers check raw is valid JSON
// (json.Valid, or encoding/json, which checks a document before it calls a
// method of a value in it). It refuses anything but an object.
func splitObject(raw []byte) ([]member, error) {
	i := skipSpace(raw, 0)
	if i == len(raw) || raw[i] != '{' {
		return nil, fmt.Errorf("%s, not an object", jsonKind(raw[i:]))
	}
	var ms []member
	if i = skipSpace(raw, i+1); i < len(raw) && raw[i] == '}' {
		return ms, nil
	}
	for {
		if i == len(raw) || raw[i] != '"' {
			return nil, errBadObject
		}
		end := skipString(raw, i)
		if end < 0 {
			return nil, errBadObject
		}
		m := member{rawKey: raw[i:end]}
		if bytes.IndexByte(m.rawKey, '\\') < 0 {
			m.key = string(m.rawKey[1 : len(m.rawKey)-1])
		} else if err := json.Unmarshal(m.rawKey, &m.key); err != nil {
			return nil, err
		}
		if i = skipSpace(raw, end); i == len(raw) || raw[i] != ':' {
			return nil, errBadObject
		}
		i = skipSpace(raw, i+1)
		end = skipValue(raw, i)
		if end < 0 {
			return nil, errBadObject
		}
		m.value = raw[i:end]
		ms = append(ms, m)
		switch i = skipSpace(raw, end); {
		case i < len(raw) && raw[i] == ',':
			i = skipSpace(raw, i+1)
		case i < len(raw) && raw[i] == '}':
			return ms, nil
		default:
			return nil, errBadObject
		}
	}
}

var errBadObject = errors.New("not a well-formed JSON object")

// skipSpace returns the index of the first byte of raw at or after i that
// is not JSON white space.
func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the JSON string starting at
// raw[i] (a quote), or -1 when it does not end.
func skipString(raw []byte, i int) int {
	for j := i + 1; j < len(raw); j++ {
		switch raw[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue returns the index just past the JSON value starting at raw[i],
// or -1 when it does not end.
func skipValue(raw []byte, i int) int {
	if i == len(raw) {
		return -1
	}
	switch raw[i] {
	case '"':
		return skipString(raw, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(raw); j++ {
			switch raw[j] {
			case '"':
				if j = skipString(raw, j); j < 0 {
					return -1
				}
				j--
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for ; j < len(raw); j++ {
		switch raw[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return j
		}
	}
	return j
}

// jsonKind names the JSON value raw starts with.
func jsonKind(raw []byte) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// encodeObject encodes v, the plain form of a details type, as
// encoding/json does, with rest, the members it was read with that this
// build does not know, after its own. rest never holds a key v writes:
// decodeObject keeps only keys that are not v's.
func encodeObject(v any, rest members) ([]byte, error) {
	out, err := json.Marshal(v)
	if err != nil || rest == "" {
		return out, err
	}
	if len(out) < 2 || out[len(out)-1] != '}' {
		return nil, errors.New("batch: a details object did not encode as a JSON object")
	}
	b := make([]byte, 0, len(out)+len(rest)+1)
	b = append(b, out[:len(out)-1]...)
	if len(out) > 2 {
		b = append(b, ',')
	}
	b = append(b, rest...)
	return append(b, '}'), nil
}
