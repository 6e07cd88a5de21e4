// Package reloadfile holds a file parsed into a value and read again when
// it changes: the notification destinations file of a worker and the
// tenant tokens file of enqueue serve.
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
// value last read. A nil *File has no file: Current is the zero T, Path
// "", Reload ErrNoFile, and Watch returns at once.
type File[T any] struct {
	path   string
	name   string
	parse  func(raw []byte) (T, error)
	loaded func(T)

	mu  sync.RWMutex
	cur T
	raw []byte // the file as last read, to tell a change
}

// New returns the File at path holding initial until a Reload reads it.
// name starts the error of a file that cannot be read ("<name>: <error>");
// parse turns the file's bytes into the value, its error returned as is;
// loaded (may be nil) is called with every value read, after it is in
// force (to log it).
func New[T any](path, name string, initial T, parse func(raw []byte) (T, error), loaded func(T)) *File[T] {
	return &File[T]{path: path, name: name, parse: parse, loaded: loaded, cur: initial}
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
// keeping the value it had.
func (f *File[T]) Reload() error {
	if f == nil {
		return ErrNoFile
	}
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("%s: %w", f.name, err)
	}
	f.mu.RLock()
	same := f.raw != nil && bytes.Equal(raw, f.raw)
	f.mu.RUnlock()
	if same {
		return nil
	}
	v, err := f.parse(raw)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.cur, f.raw = v, raw
	f.mu.Unlock()
	if f.loaded != nil {
		f.loaded(v)
	}
	return nil
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
