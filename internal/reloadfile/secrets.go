package reloadfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrNoSecret is the error of a secrets file that holds no value (only
// blank lines and comments).
var ErrNoSecret = errors.New("holds no value")

// Secrets is a file of the current values of one credential (enqueue
// serve's import tokens, its HMAC secrets): one value per line, blank
// lines and lines starting with # skipped, spaces around a value ignored.
// Every value is accepted, so a credential rotates without a cut-over: add
// the new value's line, move the clients to it, remove the old line. It
// fails closed (NewFailClosed): while the file cannot be read, or holds no
// value, no value is current. A nil *Secrets has no value.
type Secrets struct {
	file *File[[][]byte]
}

// ParseSecrets returns the values of a secrets file, in file order, or
// ErrNoSecret for a file without one. A value is never part of an error.
func ParseSecrets(raw []byte) ([][]byte, error) {
	var out [][]byte
	for _, line := range bytes.Split(raw, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		out = append(out, line)
	}
	if len(out) == 0 {
		return nil, ErrNoSecret
	}
	return out, nil
}

// LoadSecrets reads the secrets file at path, named name in errors ("<name>:
// <error>"). A file that cannot be read or holds no value is an error: a
// process does not start without a credential it was told to accept.
// loaded, if not nil, is called with the number of values of every
// changed file read that holds one, from the first on.
func LoadSecrets(path, name string, loaded func(values int)) (*Secrets, error) {
	parse := func(raw []byte) ([][]byte, error) {
		v, err := ParseSecrets(raw)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, path, err)
		}
		return v, nil
	}
	var onLoad func([][]byte)
	if loaded != nil {
		onLoad = func(v [][]byte) {
			if len(v) > 0 { // a file without a value is an error, reported as such
				loaded(len(v))
			}
		}
	}
	s := &Secrets{file: NewFailClosed(path, name, nil, parse, onLoad)}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Path is the file read ("" for a nil *Secrets).
func (s *Secrets) Path() string {
	if s == nil {
		return ""
	}
	return s.file.Path()
}

// Current returns the values in force: none while the file cannot be read
// or holds none. The slice is shared: callers must not change it.
func (s *Secrets) Current() [][]byte {
	if s == nil {
		return nil
	}
	return s.file.Current()
}

// Reload reads the file again: its values replace the ones in force, or,
// for a file that cannot be read or holds no value, none is in force and
// the error is returned.
func (s *Secrets) Reload() error {
	if s == nil {
		return ErrNoFile
	}
	return s.file.Reload()
}

// Watch reloads the file every interval until ctx ends (a mounted
// Kubernetes Secret is updated by a symlink swap, which reading the path
// again sees), calling failed, if not nil, with the error of each reload
// that left no value in force.
func (s *Secrets) Watch(ctx context.Context, every time.Duration, failed func(error)) {
	if s == nil {
		return
	}
	s.file.Watch(ctx, every, failed)
}
