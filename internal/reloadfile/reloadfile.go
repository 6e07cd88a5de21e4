// Package reloadfile holds a file parsed into a value and read again when
// it changes: the notification destinations file of a worker, and enqueue
// serve's credential files (tenant tokens, import tokens, HMAC secrets).
//
// A File made by New keeps the value last read while its file does not
// read or parse: a worker goes on sending to the destinations it knew. A
// credential must not outlive the file that grants it, so a File made by
// NewFailClosed has its closed value (no credential) whenever its file
// cannot be read, and takes what its parse returns even with an error (the
// lines that parse, the others refused and reported): a line removed from
// the file is out of force at the next reload whatever else is wrong with
// the file. Secrets is such a file of secret values, one per line.
package reloadfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ErrNoFile is the error of Reload on a nil *File.
var ErrNoFile = errors.New("no file")

// File is a file at Path parsed into a T, read again by Reload (once) or
// Watch (every interval). A file that no longer reads or parses keeps the
// value last read (New) or fails closed (NewFailClosed). A nil *File has
// no file: Current is the zero T, Path "", Reload ErrNoFile, and Watch
// returns at once.
type File[T any] struct {
	path   string
	name   string
	parse  func(raw []byte) (T, error)
	loaded func(T)
	// failClosed: an unreadable file puts closed in force, and a parse's
	// value is taken with its error (NewFailClosed).
	failClosed bool
	closed     T

	mu      sync.RWMutex
	cur     T
	raw     []byte // the file as last read, to tell a change
	lastErr error  // the parse error of raw (fail closed only), returned again while it is unchanged
}

// New returns the File at path holding initial until a Reload reads it.
// name starts the error of a file that cannot be read ("<name>: <error>");
// parse turns the file's bytes into the value, its error returned as is;
// loaded (may be nil) is called with every value read, after it is in
// force (to log it).
func New[T any](path, name string, initial T, parse func(raw []byte) (T, error), loaded func(T)) *File[T] {
	return &File[T]{path: path, name: name, parse: parse, loaded: loaded, cur: initial}
}

// NewFailClosed returns the File at path holding closed until a Reload
// reads it, and again whenever a Reload cannot read it (missing,
// unreadable): a credential file's value never outlives the file. parse
// returns the value of what it could read with an error for what it could
// not (a file of lines: the lines that parse, and which did not); the
// value is put in force either way, and Reload returns the error, again at
// every Reload while the file is unchanged, so it is reported until fixed.
// name and loaded are as for New; loaded is called for a changed file only.
func NewFailClosed[T any](path, name string, closed T, parse func(raw []byte) (T, error), loaded func(T)) *File[T] {
	return &File[T]{path: path, name: name, parse: parse, loaded: loaded, failClosed: true, closed: closed, cur: closed}
}

// Path is the file read.
func (f *File[T]) Path() string {
	if f == nil {
		return ""
	}
	return f.path
}

// Reload reads the file again and, if it changed and parses, replaces the
// value. It returns the error of a file that cannot be read or parsed,
// keeping the value it had (New), or, for a File of NewFailClosed, putting
// closed in force for a file it cannot read and what the parse returned
// for one it read.
func (f *File[T]) Reload() error {
	if f == nil {
		return ErrNoFile
	}
	raw, err := os.ReadFile(f.path)
	if err != nil {
		if f.failClosed {
			f.mu.Lock()
			f.cur, f.raw, f.lastErr = f.closed, nil, nil
			f.mu.Unlock()
		}
		return fmt.Errorf("%s: %w", f.name, err)
	}
	f.mu.RLock()
	same, lastErr := f.raw != nil && bytes.Equal(raw, f.raw), f.lastErr
	f.mu.RUnlock()
	if same {
		return lastErr
	}
	v, err := f.parse(raw)
	if err != nil && !f.failClosed {
		return err
	}
	f.mu.Lock()
	f.cur, f.raw, f.lastErr = v, raw, err
	f.mu.Unlock()
	if f.loaded != nil {
		f.loaded(v)
	}
	return err
}

// Watch reloads the file every interval until ctx ends (Kubernetes updates
// a mounted Secret by swapping a symlink: reading the path again sees the
// new file, where a watch on the old inode would not), calling failed, if
// not nil, with the error of a reload that could not read or parse it.
func (f *File[T]) Watch(ctx context.Context, every time.Duration, failed func(error)) {
	if f == nil {
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
		if err := f.Reload(); err != nil && failed != nil {
			failed(err)
		}
	}
}

// Current returns the value in force (the zero T for a nil *File).
func (f *File[T]) Current() T {
	if f == nil {
		var zero T
		return zero
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.cur
}
