package redshift

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"
)

// Defaults of Config.
const (
	// PartBytesDefault bounds one compressed staging part.
	PartBytesDefault int64 = 64 << 20
	// UploadPartBytesDefault is the multipart upload chunk of a staging part
	// (S3's minimum is 5 MiB).
	UploadPartBytesDefault int64 = 5 << 20
	// LoadTimeoutDefault is how long a load's transaction is awaited.
	LoadTimeoutDefault = time.Hour
	// QueryTimeoutDefault is how long a stamp read, a publication or a
	// migration is awaited.
	QueryTimeoutDefault = 2 * time.Minute
	// PollIntervalDefault is the first DescribeStatement interval; it grows
	// to PollMaxDefault.
	PollIntervalDefault = 100 * time.Millisecond
	// PollMaxDefault is the longest DescribeStatement interval.
	PollMaxDefault = 2 * time.Second
	// LoadPollIntervalDefault is the first DescribeStatement interval of
	// a load's transactions (which run for minutes); it grows to
	// LoadPollMaxDefault.
	LoadPollIntervalDefault = time.Second
	// LoadPollMaxDefault is the longest DescribeStatement interval of a
	// load's transactions.
	LoadPollMaxDefault = 10 * time.Second
	// ConflictRetriesDefault is how many times a transaction that failed
	// on a transient conflict is submitted again within one load or
	// publication.
	ConflictRetriesDefault = 5
	// RetryBackoffDefault is the first wait before such a retry; it
	// doubles up to RetryBackoffMaxDefault.
	RetryBackoffDefault = time.Second
	// RetryBackoffMaxDefault is the longest wait before such a retry.
	RetryBackoffMaxDefault = 30 * time.Second
	// MaxRecordBytesDefault is Redshift's limit on one JSON object read by
	// COPY (4 MB, before any parsing), taken as decimal megabytes to stay on
	// the safe side. It applies to a whole staged line: the record plus its
	// tenant, scope, batch, generation, object key and line number.
	MaxRecordBytesDefault = 4_000_000
	// MaxStringBytesDefault is Redshift's limit on one string value inside a
	// SUPER value (the VARCHAR maximum, 65,535 bytes). Clusters that opted
	// into 16,000,000-byte SUPER strings may raise it.
	MaxStringBytesDefault = 65_535
	// MaxDepthDefault is SUPER's limit on nested arrays and objects.
	MaxDepthDefault = 1_000
)

// Config configures the Redshift warehouse.
type Config struct {
	// WorkgroupName names a Redshift Serverless workgroup. Exactly one of
	// WorkgroupName and ClusterID is set.
	WorkgroupName string
	// ClusterID names a provisioned cluster.
	ClusterID string
	// Database is the database holding schema curated. Required.
	Database string
	// SecretARN is a Secrets Manager secret with the database user's
	// credentials. Without it (and without DBUser) the Data API derives
	// the database user from the caller's IAM identity
	// (redshift-serverless:GetCredentials or redshift:GetClusterCredentialsWithIAM).
	SecretARN string
	// DBUser is a database user for temporary credentials
	// (redshift:GetClusterCredentials); provisioned clusters only.
	DBUser string
	// IAMRole is the role Redshift assumes to read the staging objects
	// during COPY (an IAM role ARN associated with the cluster or
	// workgroup, or "default" for its default role). Required.
	IAMRole string
	// Staging is where loads are staged: s3://bucket/prefix/. Required.
	// The bucket must be in the warehouse's region.
	Staging string

	// PartBytes bounds one compressed staging part. Defaults to
	// PartBytesDefault (64 MiB).
	PartBytes int64
	// UploadPartBytes is the multipart chunk size, and so the memory one
	// staging part costs. Defaults to UploadPartBytesDefault (5 MiB).
	UploadPartBytes int64
	// LoadTimeout bounds how long a load's transaction is awaited before
	// its outcome is read from the stamp. Defaults to LoadTimeoutDefault.
	LoadTimeout time.Duration
	// QueryTimeout bounds stamp reads, publications and migrations.
	// Defaults to QueryTimeoutDefault.
	QueryTimeout time.Duration
	// PollInterval and PollMax shape DescribeStatement polling. Default to
	// PollIntervalDefault and PollMaxDefault.
	PollInterval, PollMax time.Duration
	// LoadPollInterval and LoadPollMax shape the polling of a load's
	// transactions (and of a statement a later delivery follows). Default
	// to LoadPollIntervalDefault and LoadPollMaxDefault.
	LoadPollInterval, LoadPollMax time.Duration
	// ConflictRetries bounds how many times a transaction that failed on a
	// transient conflict (Redshift's 1023 serializable isolation
	// violation, a snapshot-isolation conflict, an aborted statement) is
	// submitted again, from the same staging, within one load or
	// publication. Defaults to ConflictRetriesDefault; negative disables.
	ConflictRetries int
	// RetryBackoff and RetryBackoffMax shape the wait before such a retry.
	// Default to RetryBackoffDefault and RetryBackoffMaxDefault.
	RetryBackoff, RetryBackoffMax time.Duration
	// MaxRecordBytes, MaxStringBytes and MaxDepth are the limits records
	// are held to before staging. Default to MaxRecordBytesDefault,
	// MaxStringBytesDefault and MaxDepthDefault.
	MaxRecordBytes, MaxStringBytes, MaxDepth int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

var (
	// S3 bucket names (general purpose buckets).
	bucketPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
	// Staging prefixes are inlined into COPY's FROM literal (COPY takes no
	// bind parameters), so they are held to characters that need no quoting.
	prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_./=-]*$`)
	// IAM role ARNs, inlined into COPY's IAM_ROLE literal for the same
	// reason.
	rolePattern = regexp.MustCompile(`^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}$`)
	// Workgroup names, cluster ids, databases and users.
	namePattern = regexp.MustCompile(`^[A-Za-z0-9_$.-]{1,128}$`)
	// Secrets Manager ARNs or names.
	secretPattern = regexp.MustCompile(`^[A-Za-z0-9:/_+=.@!-]+$`)
)

// ConfigError names the setting that is invalid.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return e.Field + ": " + e.Reason }

func bad(field, format string, args ...any) error {
	return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ValidateTarget reports the first invalid setting among those that name
// the warehouse and authenticate to it (all a Migrator needs), as a
// *ConfigError.
func (c Config) ValidateTarget() error {
	switch {
	case c.WorkgroupName == "" && c.ClusterID == "":
		return bad("workgroup", "set a Redshift Serverless workgroup or a provisioned cluster id")
	case c.WorkgroupName != "" && c.ClusterID != "":
		return bad("workgroup", "set either a workgroup or a cluster id, not both")
	case c.WorkgroupName != "" && !namePattern.MatchString(c.WorkgroupName):
		return bad("workgroup", "%q is not a workgroup name", c.WorkgroupName)
	case c.ClusterID != "" && !namePattern.MatchString(c.ClusterID):
		return bad("cluster-id", "%q is not a cluster identifier", c.ClusterID)
	case c.Database == "":
		return bad("database", "required")
	case !namePattern.MatchString(c.Database):
		return bad("database", "%q is not a database name", c.Database)
	case c.SecretARN != "" && c.DBUser != "":
		return bad("secret-arn", "set either a secret or a database user, not both")
	case c.SecretARN != "" && !secretPattern.MatchString(c.SecretARN):
		return bad("secret-arn", "not a Secrets Manager secret ARN or name")
	case c.DBUser != "" && c.ClusterID == "":
		return bad("db-user", "temporary credentials for a database user need a provisioned cluster id; a workgroup derives the user from the IAM identity")
	case c.DBUser != "" && !namePattern.MatchString(c.DBUser):
		return bad("db-user", "%q is not a database user name", c.DBUser)
	case c.QueryTimeout < 0 || c.PollInterval < 0 || c.PollMax < 0 || c.RetryBackoff < 0 || c.RetryBackoffMax < 0 || c.LoadPollInterval < 0 || c.LoadPollMax < 0:
		return bad("timeouts", "must not be negative")
	}
	return nil
}

// Validate reports the first invalid setting as a *ConfigError.
func (c Config) Validate() error {
	if err := c.ValidateTarget(); err != nil {
		return err
	}
	switch {
	case c.IAMRole == "":
		return bad("iam-role", "required: the IAM role Redshift assumes to read the staging objects")
	case c.IAMRole != "default" && !rolePattern.MatchString(c.IAMRole):
		return bad("iam-role", "%q is not an IAM role ARN (arn:aws:iam::123456789012:role/name) or \"default\"", c.IAMRole)
	case c.PartBytes != 0 && c.PartBytes < 2*int64(cmp.Or(c.MaxRecordBytes, MaxRecordBytesDefault))+1<<20:
		return bad("part-bytes", "must be at least twice the record limit plus 1 MiB (%d bytes)", 2*int64(cmp.Or(c.MaxRecordBytes, MaxRecordBytesDefault))+1<<20)
	case c.UploadPartBytes != 0 && c.UploadPartBytes < 5<<20:
		return bad("upload-part-bytes", "S3 multipart chunks are at least 5 MiB")
	case c.LoadTimeout < 0:
		return bad("timeouts", "must not be negative")
	case c.MaxRecordBytes < 0 || c.MaxStringBytes < 0 || c.MaxDepth < 0:
		return bad("limits", "must not be negative")
	}
	if _, _, err := ParseStaging(c.Staging); err != nil {
		return bad("staging", "%v", err)
	}
	return nil
}

// ParseStaging splits s3://bucket/prefix/ into the bucket and the key
// prefix, which is empty or ends with "/".
func ParseStaging(raw string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(raw, "s3://")
	if !ok {
		return "", "", errors.New("want s3://bucket/prefix/")
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if !bucketPattern.MatchString(bucket) || strings.Contains(bucket, "..") {
		return "", "", fmt.Errorf("%q is not an S3 bucket name", bucket)
	}
	if !prefixPattern.MatchString(prefix) || strings.Contains(prefix, "//") || strings.HasPrefix(prefix, "/") {
		return "", "", fmt.Errorf("prefix %q: use letters, digits and _ . / = - only, without empty segments", prefix)
	}
	for _, seg := range strings.Split(strings.TrimSuffix(prefix, "/"), "/") {
		if seg == "." || seg == ".." {
			return "", "", fmt.Errorf("prefix %q: no . or .. segments", prefix)
		}
	}
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return bucket, prefix, nil
}

// withDefaults returns c with every zero setting at its default.
func (c Config) withDefaults() Config {
	c.PartBytes = cmp.Or(c.PartBytes, PartBytesDefault)
	c.UploadPartBytes = cmp.Or(c.UploadPartBytes, UploadPartBytesDefault)
	c.LoadTimeout = cmp.Or(c.LoadTimeout, LoadTimeoutDefault)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, QueryTimeoutDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.PollMax = max(cmp.Or(c.PollMax, PollMaxDefault), c.PollInterval)
	c.LoadPollInterval = cmp.Or(c.LoadPollInterval, LoadPollIntervalDefault)
	c.LoadPollMax = max(cmp.Or(c.LoadPollMax, LoadPollMaxDefault), c.LoadPollInterval)
	c.ConflictRetries = max(cmp.Or(c.ConflictRetries, ConflictRetriesDefault), 0)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, RetryBackoffDefault)
	c.RetryBackoffMax = max(cmp.Or(c.RetryBackoffMax, RetryBackoffMaxDefault), c.RetryBackoff)
	c.MaxRecordBytes = cmp.Or(c.MaxRecordBytes, MaxRecordBytesDefault)
	c.MaxStringBytes = cmp.Or(c.MaxStringBytes, MaxStringBytesDefault)
	c.MaxDepth = cmp.Or(c.MaxDepth, MaxDepthDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}
