// Package miniotest runs a real MinIO server for tests, as a process of its
// own: the S3-compatible store most used on premises, with its own bucket
// notifications (a webhook target configured through its environment),
// started on a free loopback port with a temporary data directory and
// reached through the real AWS SDK (path-style addressing, static
// credentials).
//
// The binary is installed, not vendored: make test (scripts/test-deps.sh)
// builds the pinned version with
//
//	GOBIN="$HOME/.cache/fleet-ingest/minio" go install github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c
//
// (about ten minutes on two cores, the first time) and exports MINIO_BIN
// with its path. Start fails the test when the binary cannot be found,
// naming the command that installs it, or does not start; only a binary
// not found under go test -short skips the test
// (internal/testkit/testdeps).
//
// Code under test finds the server the way production code finds an
// S3-compatible store: through the SDK's configuration (Env:
// AWS_ENDPOINT_URL_S3, static credentials, a region) and path-style
// addressing (the worker's and reconcile's --s3-path-style). Env names the
// server "localhost", not 127.0.0.1: the SDK addresses an IP endpoint by
// path of its own accord, a host name by virtual host (bucket.localhost),
// which MinIO without MINIO_DOMAIN does not serve, so a client without
// path-style addressing fails here as it would against a MinIO of its own
// host name.
//
// Notifications: WebhookEnv configures a webhook target (MinIO's
// MINIO_NOTIFY_WEBHOOK_*_<ID> variables, no mc needed) to pass to Start,
// and Notify sets a bucket's notification configuration through the S3
// API (PutBucketNotificationConfiguration, the target's ARN
// arn:minio:sqs::<ID>:webhook). MinIO posts each event to the endpoint
// with "Authorization: Bearer <token>" as its webhook envelope
// ({"EventName", "Key", "Records"}), without a queue directory: an event
// the endpoint does not answer 2xx is dropped after MinIO logs it.
package miniotest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/fleet/ingest/internal/testkit/testdeps"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// EnvBin names the MinIO binary.
const EnvBin = "MINIO_BIN"

// Module and Version are the MinIO build the tests are written against.
const (
	Module  = "github.com/minio/minio"
	Version = "v0.0.0-20260212201848-7aac2a2c5b7c"
)

// Region is the region clients sign with: MinIO without MINIO_REGION
// accepts us-east-1 and writes an empty awsRegion in its events.
const Region = "us-east-1"

// The root credentials of every server (MinIO wants a secret of at least
// eight characters).
const (
	AccessKey = "miniotest"
	SecretKey = "miniotest-secret"
)

// startTimeout bounds a server's start: MinIO formats its drive first.
const startTimeout = 60 * time.Second

// Server is a running MinIO process.
type Server struct {
	// URL is the server's endpoint for clients (http://localhost:port).
	URL  string
	Port int

	cmd  *exec.Cmd
	dir  string
	logs *testproc.SyncBuffer
	done chan struct{}
	once sync.Once
}

// Bin returns the MinIO binary MINIO_BIN names, or an error saying how to
// install one.
func Bin() (string, error) {
	bin := os.Getenv(EnvBin)
	if bin == "" {
		return "", fmt.Errorf("%s is not set: install MinIO with GOBIN=DIR go install %s@%s and export %s=DIR/minio", EnvBin, Module, Version, EnvBin)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", EnvBin, bin, err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s=%s is not an executable file", EnvBin, bin)
	}
	return bin, nil
}

// Require returns the MinIO binary, or fails the test when it is missing
// (skips it, under -short): for a test to call before it starts what it
// would give MinIO.
func Require(t testing.TB) string {
	t.Helper()
	bin, err := Bin()
	if err != nil {
		testdeps.Missing(t, "minio", "GOBIN=DIR go install "+Module+"@"+Version+", "+EnvBin+"=DIR/minio", err)
	}
	return bin
}

// Start starts a server with env added to its environment (WebhookEnv's
// variables, say) that stops when the test ends (its log shown if the
// test failed), or fails the test when MinIO is missing (skips it, under
// -short) or does not start.
func Start(t testing.TB, env ...string) *Server {
	t.Helper()
	bin := Require(t)
	if bin == "" {
		return nil
	}
	var lastErr error
	for range 3 { // a free port can be taken between its choice and the start
		s, err := start(bin, env)
		if err == nil {
			t.Cleanup(func() {
				s.Close()
				if t.Failed() {
					t.Logf("minio logs:\n%s", s.Logs())
				}
			})
			return s
		}
		lastErr = err
	}
	t.Fatalf("miniotest: %v", lastErr)
	return nil
}

func start(bin string, env []string) (*Server, error) {
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	console, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "miniotest-")
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"data", "certs", "home"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	s := &Server{
		URL: "http://" + net.JoinHostPort("localhost", strconv.Itoa(port)), Port: port,
		dir: dir, logs: &testproc.SyncBuffer{}, done: make(chan struct{}),
	}
	s.cmd = exec.Command(bin, "server", "--quiet",
		"--address", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		"--console-address", net.JoinHostPort("127.0.0.1", strconv.Itoa(console)),
		"--certs-dir", filepath.Join(dir, "certs"), filepath.Join(dir, "data"))
	s.cmd.Dir = dir
	// Only what is set here: no MINIO_* or AWS_* variable of the test's
	// environment reaches the server.
	s.cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(dir, "home"),
		"MINIO_ROOT_USER=" + AccessKey, "MINIO_ROOT_PASSWORD=" + SecretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off",
	}, env...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	if err := s.awaitReady(startTimeout); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// awaitReady waits for MinIO's readiness probe to answer OK from this
// process.
func (s *Server) awaitReady(within time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	probe := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) + "/minio/health/ready"
	deadline := time.Now().Add(within)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("minio exited before it was ready on port %d: %s", s.Port, s.logs.String())
		default:
		}
		if resp, err := client.Get(probe); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				// The answer is ours only if the process still runs: one
				// that found the port taken exits.
				select {
				case <-s.done:
				case <-time.After(100 * time.Millisecond):
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("minio was not ready at %s within %s: %s", probe, within, s.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops the server (SIGTERM, SIGKILL after ten seconds) and removes
// its data.
func (s *Server) Close() {
	s.once.Do(func() {
		defer os.RemoveAll(s.dir)
		select {
		case <-s.done:
			return
		default:
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
}

// Logs returns what MinIO logged so far.
func (s *Server) Logs() string { return s.logs.String() }

// Env returns the environment that points the AWS SDK's S3 clients at the
// server: endpoint, the root credentials, a region, and no instance
// metadata look-ups. Those clients must address buckets by path
// (--s3-path-style).
func (s *Server) Env() []string {
	return []string{
		"AWS_ENDPOINT_URL_S3=" + s.URL,
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// Client returns an S3 client on the server (path-style addressing).
func (s *Server) Client() *s3.Client {
	return s3.NewFromConfig(aws.Config{
		Region:      Region,
		Credentials: credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	}, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(s.URL)
		o.UsePathStyle = true
	})
}

// CreateBucket creates a bucket, failing t on error.
func (s *Server) CreateBucket(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client().CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("creating bucket %s: %v", name, err)
	}
}

// Put writes an object through the S3 API, failing t on error.
func (s *Server) Put(t testing.TB, bucket, key string, body []byte) {
	t.Helper()
	_, err := s.Client().PutObject(context.Background(), &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader(string(body)),
	})
	if err != nil {
		t.Fatalf("writing s3://%s/%s: %v", bucket, key, err)
	}
}

// WebhookEnv is the environment that gives a server the webhook
// notification target id, posting to endpoint with the bearer token.
func WebhookEnv(id, endpoint, token string) []string {
	return []string{
		"MINIO_NOTIFY_WEBHOOK_ENABLE_" + id + "=on",
		"MINIO_NOTIFY_WEBHOOK_ENDPOINT_" + id + "=" + endpoint,
		"MINIO_NOTIFY_WEBHOOK_AUTH_TOKEN_" + id + "=" + token,
	}
}

// WebhookARN is the ARN a bucket's notification configuration names the
// webhook target id by (MinIO without MINIO_REGION: no region).
func WebhookARN(id string) string { return "arn:minio:sqs::" + id + ":webhook" }

// Notify sends the events (such as "s3:ObjectCreated:*") of a bucket to
// the webhook target id, through the S3 API, failing t on error.
func (s *Server) Notify(t testing.TB, bucket, id string, events ...types.Event) {
	t.Helper()
	_, err := s.Client().PutBucketNotificationConfiguration(context.Background(), &s3.PutBucketNotificationConfigurationInput{
		Bucket: aws.String(bucket),
		NotificationConfiguration: &types.NotificationConfiguration{QueueConfigurations: []types.QueueConfiguration{{
			QueueArn: aws.String(WebhookARN(id)), Events: events,
		}}},
	})
	if err != nil {
		t.Fatalf("configuring the notifications of bucket %s: %v", bucket, err)
	}
}
