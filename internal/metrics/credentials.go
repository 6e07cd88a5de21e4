package metrics

import "github.com/prometheus/client_golang/prometheus"

// SecretFiles label ingest_secret_file_reload_failures_total: enqueue
// serve's files of credential values, by the flag that names them.
var SecretFiles = []string{"auth_token_file", "hmac_secret_file", SecretFileOperatorTokens}

// SecretFileOperatorTokens is the file label of enqueue serve's operator
// tokens file (--operator-token-file): a reload that found it unreadable
// (no operator token is accepted until it reads) or a line of it
// malformed (that line is refused, the others apply).
const SecretFileOperatorTokens = "operator_token_file"

// newCredentials creates the metrics of enqueue serve's credential files,
// registered by NewServe only (no other binary reads them): neither goes
// to f.
func (m *Metrics) newCredentials() {
	m.TenantTokensRefusedLines = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ingest_tenant_tokens_refused_lines",
		Help: "Lines of enqueue serve's tenant tokens file (--tenant-tokens-file) in force that are refused (malformed, or a hash given twice): their tokens are not accepted, the other lines are. 0 while the file cannot be read (then no tenant token is accepted; ingest_tenant_tokens_reload_failures_total counts).",
	})
	m.SecretFileReloadFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_secret_file_reload_failures_total",
		Help: "Reloads of a file of credential values of enqueue serve (file: auth_token_file, the import tokens; hmac_secret_file, the HMAC secrets; operator_token_file, the operator tokens) that could not read it or found no value in it (operator_token_file: or a malformed line, refused while the other lines apply): until it reads, no value of that credential is accepted.",
	}, []string{"file"})
	for _, f := range SecretFiles {
		m.SecretFileReloadFailures.WithLabelValues(f)
	}
}
