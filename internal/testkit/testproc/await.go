package testproc

import (
	"testing"
	"time"
)

// AwaitLimit bounds Await.
const AwaitLimit = 2 * time.Minute

// Await receives from ch (a fault injection's signal, a goroutine's
// result) within AwaitLimit, and fails the test naming what it waited for
// otherwise: a signal that never comes — the code under test ended before
// it reached the injected fault, say — fails that test instead of hanging
// its package until go test's timeout.
func Await[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(AwaitLimit):
		t.Fatalf("waited %s for %s", AwaitLimit, what)
	}
	var zero T
	return zero
}
