package folder

import "sync/atomic"

// Progress counts what the record readers of one Source have read so far:
// objects read to their end and records returned. It is safe to read while a
// load runs in another goroutine, so a pipeline can sample it without the
// warehouse (which owns the reading) knowing.
type Progress struct {
	objects atomic.Int64
	records atomic.Int64
}

// Objects returns how many objects were read to their end.
func (p *Progress) Objects() int64 { return p.objects.Load() }

// Records returns how many records were read.
func (p *Progress) Records() int64 { return p.records.Load() }

// Progress returns the source's read counters.
func (s *Source) Progress() *Progress { return &s.progress }
