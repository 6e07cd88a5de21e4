// Package sqstest runs an SQS-compatible server for tests as a process of
// its own: the npm package local-aws-sqs (2.0.2), which speaks the JSON
// protocol (x-amz-json-1.0) of the current AWS SDK, started with Node on a
// free loopback port and reached through the real AWS SDK for Go v2.
//
// The package is installed, not vendored: make test (scripts/test-deps.sh)
// runs
//
//	npm install --prefix "$HOME/.cache/fleet-ingest/local-aws-sqs" local-aws-sqs@2.0.2
//
// and exports LOCAL_AWS_SQS_DIR with that prefix. Start fails the test when
// the package (or node) cannot be found, naming the command that installs
// it; only under go test -short is the test skipped (internal/testkit/testdeps).
//
// Code under test finds the server the way production code finds SQS:
// through the SDK's configuration (Env: AWS_ENDPOINT_URL_SQS, static
// credentials, a region). Client returns an SDK client for test setup.
//
// How it differs from SQS: a long poll waits its whole WaitTimeSeconds
// unless MaxNumberOfMessages arrived (SQS answers as soon as messages are
// there), so tests short-poll; a message whose visibility timeout ends
// during a poll can be handed out twice in one answer; ReceiveMessage reads
// the system attributes only from AttributeNames, their former name.
//
// What it does not emulate: authentication and queue policies (any
// credentials are accepted), SNS and S3 (tests send the envelopes those
// services would), regions, and SQS's own throughput limits.
package sqstest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/fleet/ingest/internal/testkit/testdeps"
)

// DirEnv names the environment variable holding the npm prefix where
// local-aws-sqs is installed (its node_modules directory is below it).
const DirEnv = "LOCAL_AWS_SQS_DIR"

// Region is the region every client of the server uses.
const Region = "us-east-1"

// launcher starts the server on a free loopback port and prints its port as
// one JSON line; it exits when its standard input closes (the test ended
// or the test process died).
const launcher = `
const { createSqsServer } = require(process.argv[1]);
createSqsServer({ port: 0, hostname: "127.0.0.1", emulateQueueCreationLifecycle: false }).then((s) => {
  process.stdout.write(JSON.stringify({ port: s.address().port }) + "\n");
});
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
`

// Server is a running local-aws-sqs process.
type Server struct {
	// URL is the server's endpoint (http://127.0.0.1:port).
	URL string

	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	once  sync.Once
}

// Start starts a server that stops when the test ends, or fails (skips,
// under -short) the test when local-aws-sqs is missing.
func Start(t testing.TB) *Server {
	t.Helper()
	module, err := modulePath()
	if err != nil {
		testdeps.Missing(t, "local-aws-sqs", "npm install --prefix $HOME/.cache/fleet-ingest/local-aws-sqs local-aws-sqs@2.0.2, and "+DirEnv+" set to that prefix", err)
		return nil
	}
	s, err := start(module)
	if err != nil {
		t.Fatalf("sqstest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// New starts a server outside a test (the benchmark harness); Close stops
// it. It fails when local-aws-sqs cannot be found below DirEnv.
func New() (*Server, error) {
	module, err := modulePath()
	if err != nil {
		return nil, err
	}
	return start(module)
}

// modulePath finds the local-aws-sqs package below DirEnv.
func modulePath() (string, error) {
	dir := os.Getenv(DirEnv)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: install local-aws-sqs with npm install --prefix DIR local-aws-sqs@2.0.2 and export %s=DIR", DirEnv, DirEnv)
	}
	module := filepath.Join(dir, "node_modules", "local-aws-sqs")
	if _, err := os.Stat(filepath.Join(module, "package.json")); err != nil {
		return "", fmt.Errorf("local-aws-sqs is not installed under %s=%s: %w", DirEnv, dir, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "", fmt.Errorf("node is not on PATH: %w", err)
	}
	return module, nil
}

func start(module string) (*Server, error) {
	cmd := exec.Command("node", "-e", launcher, module)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting node: %w", err)
	}
	s := &Server{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	ready := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var line struct{ Port int }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Port > 0 {
				ready <- line.Port
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(s.done) }()
	select {
	case port := <-ready:
		s.URL = fmt.Sprintf("http://127.0.0.1:%d", port)
		return s, nil
	case <-s.done:
		return nil, fmt.Errorf("local-aws-sqs exited before listening: %s", stderr.String())
	case <-time.After(30 * time.Second):
		s.Close()
		return nil, errors.New("local-aws-sqs did not listen within 30s")
	}
}

// Close stops the server.
func (s *Server) Close() {
	s.once.Do(func() {
		_ = s.stdin.Close()
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
}

// Pid is the server's process id (the benchmark reads its CPU time).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Env returns the environment that points the AWS SDK's SQS clients at the
// server: endpoint, static credentials, region, no instance metadata.
func (s *Server) Env() []string {
	return []string{
		"AWS_ENDPOINT_URL_SQS=" + s.URL,
		"AWS_ACCESS_KEY_ID=sqstest",
		"AWS_SECRET_ACCESS_KEY=sqstest-secret",
		"AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// Client returns an SQS client on the server.
func (s *Server) Client() *sqs.Client {
	return sqs.NewFromConfig(aws.Config{
		Region:      Region,
		Credentials: credentials.NewStaticCredentialsProvider("sqstest", "sqstest-secret", ""),
	}, func(o *sqs.Options) { o.BaseEndpoint = aws.String(s.URL) })
}

// CreateQueue creates a queue with the attributes (VisibilityTimeout,
// RedrivePolicy, …) and returns its URL, failing t on error.
func (s *Server) CreateQueue(t testing.TB, name string, attrs map[string]string) string {
	t.Helper()
	out, err := s.Client().CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("creating queue %s: %v", name, err)
	}
	return aws.ToString(out.QueueUrl)
}

// QueueARN returns a queue's ARN, failing t on error.
func (s *Server) QueueARN(t testing.TB, url string) string {
	t.Helper()
	out, err := s.Client().GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		t.Fatalf("queue attributes of %s: %v", url, err)
	}
	return out.Attributes[string(types.QueueAttributeNameQueueArn)]
}

// Send sends bodies to a queue in batches of ten, failing t on error.
func (s *Server) Send(t testing.TB, url string, bodies ...string) {
	t.Helper()
	c := s.Client()
	for start := 0; start < len(bodies); start += 10 {
		var entries []types.SendMessageBatchRequestEntry
		for i, b := range bodies[start:min(start+10, len(bodies))] {
			entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), MessageBody: aws.String(b)})
		}
		out, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		if err != nil {
			t.Fatalf("sending to %s: %v", url, err)
		}
		if len(out.Failed) > 0 {
			t.Fatalf("sending to %s: %d entries failed: %s", url, len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
	}
}

// Counts returns a queue's approximate numbers of visible and in-flight
// messages, failing t on error.
func (s *Server) Counts(t testing.TB, url string) (visible, inFlight int) {
	t.Helper()
	out, err := s.Client().GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		},
	})
	if err != nil {
		t.Fatalf("queue attributes of %s: %v", url, err)
	}
	_, _ = fmt.Sscan(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)], &visible)
	_, _ = fmt.Sscan(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)], &inFlight)
	return visible, inFlight
}
