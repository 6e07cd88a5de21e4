package uploads

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of the door's rate limit, as enqueue serve sets them
// (Config.RateLimit itself is off when zero).
const (
	// RateLimitDefault is the sustained rate, in folders per second, one
	// credential may start.
	RateLimitDefault = 500
	// RateBurstDefault is the most folders one credential may start at
	// once, and so in one request.
	RateBurstDefault = 200
)

// doorLimiter is a token bucket per credential: the import token, the
// HMAC secret, each SNS topic (credentialKey). Every request that passed
// authentication takes one token per folder it would start, at least one;
// requests that did not authenticate take none, so they cannot spend a
// caller's budget. The keys are few and fixed by the configuration, so the
// buckets are never evicted. A nil *doorLimiter admits everything.
type doorLimiter struct {
	limit rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

func newDoorLimiter(perSecond float64, burst int) *doorLimiter {
	if perSecond <= 0 {
		return nil
	}
	return &doorLimiter{limit: rate.Limit(perSecond), burst: burst, buckets: map[string]*rate.Limiter{}}
}

// doorAdmission is the answer of doorLimiter.admit.
type doorAdmission int

const (
	admitted doorAdmission = iota
	// rateLimited: not now; retry after the returned delay.
	rateLimited
	// overBurst: never, the request starts more folders than the burst.
	overBurst
)

// admit takes n tokens from key's bucket, or none and says when enough
// will have accrued.
func (d *doorLimiter) admit(key string, n int) (doorAdmission, time.Duration) {
	if d == nil {
		return admitted, 0
	}
	n = max(n, 1)
	if n > d.burst {
		return overBurst, 0
	}
	d.mu.Lock()
	lim, ok := d.buckets[key]
	if !ok {
		lim = rate.NewLimiter(d.limit, d.burst)
		d.buckets[key] = lim
	}
	d.mu.Unlock()
	now := time.Now()
	r := lim.ReserveN(now, n)
	if delay := r.DelayFrom(now); delay > 0 {
		r.CancelAt(now)
		return rateLimited, delay
	}
	return admitted, 0
}

// retryAfter is delay in whole seconds, at least one, for Retry-After.
func retryAfter(delay time.Duration) int {
	return max(1, int(math.Ceil(delay.Seconds())))
}

// rateLimitedBody is the JSON answer of a request refused by the rate
// limit.
type rateLimitedBody struct {
	Outcome           string `json:"outcome"`
	Error             string `json:"error"`
	RetryAfterSeconds int    `json:"retry_after_seconds"`
}

// refuseRateLimited answers a request over its credential's rate: 429, or
// 503 to Amazon SNS, which retries a 5xx but drops a message answered 4xx;
// both with Retry-After.
func (s *Server) refuseRateLimited(w http.ResponseWriter, route, credential string, folders int, delay time.Duration) {
	status := http.StatusTooManyRequests
	if isSNSCredential(credential) {
		status = http.StatusServiceUnavailable
	}
	secs := retryAfter(delay)
	s.cfg.Logger.Warn("request refused: rate limited", "route", route, "credential", credential, "folders", folders, "retry_after_seconds", secs)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	s.reply(w, route, status, "rate_limited", rateLimitedBody{
		Outcome: "rate_limited", RetryAfterSeconds: secs,
		Error: "too many requests or folders for this credential (--rate-limit, --rate-burst): retry after " + strconv.Itoa(secs) + " s",
	})
}
