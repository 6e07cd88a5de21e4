package reloadfile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A File reads its file, keeps the value last read when the file stops
// parsing or reading, calls loaded only for a change, and Watch reports
// the failures it meets.
func TestFileReloadKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var loads []string
	parse := func(raw []byte) (string, error) {
		if strings.HasPrefix(string(raw), "bad") {
			return "", errors.New("bad file")
		}
		return strings.ToUpper(string(raw)), nil
	}
	f := New(path, "test file", "none", parse, func(v string) { loads = append(loads, v) })
	if got := f.Current(); got != "none" {
		t.Fatalf("before a reload: %q, want the initial value", got)
	}
	if err := f.Reload(); err == nil || !strings.HasPrefix(err.Error(), "test file: ") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v, want a \"test file: \" not-exist error", err)
	}
	write("a")
	for range 2 {
		if err := f.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	write("bad")
	if err := f.Reload(); err == nil || err.Error() != "bad file" {
		t.Fatalf("unparsable file: %v, want the parse error as is", err)
	}
	if got := f.Current(); got != "A" {
		t.Fatalf("after a failed reload: %q, want the value last read", got)
	}
	if strings.Join(loads, ",") != "A" {
		t.Fatalf("loaded calls %q, want one for the one change", loads)
	}

	ctx, cancel := context.WithCancel(context.Background())
	failures := make(chan error, 100)
	done := make(chan struct{})
	go func() { f.Watch(ctx, time.Millisecond, func(err error) { failures <- err }); close(done) }()
	if err := <-failures; err.Error() != "bad file" {
		t.Fatalf("watch failure %v", err)
	}
	write("b")
	deadline := time.Now().Add(5 * time.Second)
	for f.Current() != "B" {
		if time.Now().After(deadline) {
			t.Fatalf("watch did not pick up the change: %q", f.Current())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done

	var nilFile *File[string]
	if nilFile.Current() != "" || nilFile.Path() != "" || !errors.Is(nilFile.Reload(), ErrNoFile) {
		t.Fatal("a nil File holds the zero value, no path, and no file to reload")
	}
	nilFile.Watch(context.Background(), time.Millisecond, func(error) { t.Error("a nil File has nothing to watch") }) // returns at once
}
