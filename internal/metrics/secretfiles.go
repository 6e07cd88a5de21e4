package metrics

import "github.com/prometheus/client_golang/prometheus"

// SecretFileOperatorTokens is the file label of enqueue serve's operator
// tokens file (--operator-token-file) in SecretFileReloadFailures.
const SecretFileOperatorTokens = "operator-tokens"

// SecretFileReloadFailures returns ingest_secret_file_reload_failures_total
// {file}, registered on reg (or the one already there): reloads of a
// secret file of enqueue serve that found it unreadable or a line of it
// malformed (what was wrong is refused, the rest applied).
func SecretFileReloadFailures(reg prometheus.Registerer) *prometheus.CounterVec {
	return registerOrShare(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_secret_file_reload_failures_total",
		Help: "Reloads of a secret file of enqueue serve (file: operator-tokens, …) that found it unreadable or a line of it malformed; what was wrong is refused, the rest applied.",
	}, []string{"file"}))
}
