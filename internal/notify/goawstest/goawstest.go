// Package goawstest runs an SNS-compatible server for tests as a process of
// its own: goaws (github.com/Admiral-Piett/goaws v0.4.5), which serves the
// Query protocol the AWS SDK for Go v2's SNS client speaks, started on a
// free loopback port with a configuration of its own and reached through
// the real SDK.
//
// The binary is installed, not vendored: make test (scripts/test-deps.sh)
// builds it with
//
//	GOBIN="$HOME/.cache/fleet-ingest/goaws" go install github.com/Admiral-Piett/goaws/app/cmd@v0.4.5
//	mv "$HOME/.cache/fleet-ingest/goaws/cmd" "$HOME/.cache/fleet-ingest/goaws/goaws"
//
// (the module's main package is app/cmd, so go install names the binary
// cmd) and exports GOAWS_BIN with its path. Start fails the test when the
// binary cannot be found, naming the command that installs it, or does not
// start; only a binary not found under go test -short skips the test
// (internal/testkit/testdeps).
//
// Code under test finds the server the way production code finds SNS:
// through the SDK's configuration (Env: AWS_ENDPOINT_URL_SNS, static
// credentials, a region). Client returns an SDK client for test setup.
//
// What goaws v0.4.5 emulates (read in its source; TestGoawsDelivers and
// TestGoawsDoesNotEmulate check each point about delivery):
//   - CreateTopic (ARN arn:aws:sns:us-east-1:100010001000:<name>, Region and
//     AccountID), Subscribe, ConfirmSubscription, Unsubscribe, ListTopics,
//     ListSubscriptions(ByTopic), Get/SetSubscriptionAttributes
//     (RawMessageDelivery, FilterPolicy), DeleteTopic and Publish, with SQS
//     and http/https subscriptions.
//   - Delivery to an http(s) subscription is synchronous: Publish answers
//     after the endpoint did (a failing endpoint is logged, not retried,
//     and Publish still succeeds), so tests need not wait.
//   - Message attributes of DataType String (and Binary) reach the
//     endpoint as MessageAttributes {"name": {"Type": "String", "Value":
//     "…"}}, as SNS delivers them.
//   - Subscribing an http(s) endpoint sends it a SubscriptionConfirmation
//     (one second after answering Subscribe, inside the call: Subscribe
//     takes over a second) whose SubscribeURL confirms it.
//   - Messages are signed (SignatureVersion 1: SHA1withRSA over SNS's
//     canonical string), with a certificate served at SigningCertURL.
//
// What it does not emulate:
//   - Authentication and policies: any credentials, or none, are accepted;
//     SigV4 is not checked.
//   - Subscriptions need no confirmation: an unconfirmed http endpoint gets
//     every notification.
//   - FIFO topics: CreateTopic ignores attributes (FifoTopic), a .fifo name
//     is an ordinary topic, and Publish ignores MessageGroupId and
//     MessageDeduplicationId: a duplicate is delivered again, and a FIFO
//     publish without a group is not refused.
//   - Validation: subject length and characters, message size, attribute
//     names, the topic ARN's region and account (only its last segment is
//     read) are not checked.
//   - Raw message delivery to http endpoints posts the message as a JSON
//     string (quoted), not the message itself as SNS does.
//   - Its signing certificate expires five seconds after the server
//     started, is self-signed, and is served over http from the server, not
//     from an sns.<region>.amazonaws.com host: a receiver that checks the
//     certificate as it must for SNS refuses it; only the RSA signature
//     itself can be checked.
//   - Delivery retries, delivery policies, dead-letter queues, throttling,
//     message timestamps finer than a second.
//
// goaws listens on every interface (0.0.0.0) of the port it is given: it has
// no setting to bind loopback only. Clients use 127.0.0.1.
package goawstest

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
	"github.com/aws/aws-sdk-go-v2/service/sns"

	"github.com/fleet/ingest/internal/testkit/testdeps"
	"github.com/fleet/ingest/internal/testkit/testproc"
)

// EnvBin names the goaws binary.
const EnvBin = "GOAWS_BIN"

// Version is the goaws version the tests are written against.
const Version = "v0.4.5"

// Region and AccountID are the server's: its topics' ARNs are
// arn:aws:sns:<Region>:<AccountID>:<name>.
const (
	Region    = "us-east-1"
	AccountID = "100010001000"
)

// Server is a running goaws process.
type Server struct {
	// URL is the server's endpoint (http://127.0.0.1:port).
	URL  string
	Port int

	cmd  *exec.Cmd
	dir  string
	logs *testproc.SyncBuffer
	done chan struct{}
	once sync.Once
}

// Bin returns the goaws binary GOAWS_BIN names, or an error saying how to
// install one.
func Bin() (string, error) {
	bin := os.Getenv(EnvBin)
	if bin == "" {
		return "", fmt.Errorf("%s is not set: install goaws with GOBIN=DIR go install github.com/Admiral-Piett/goaws/app/cmd@%s, rename DIR/cmd to DIR/goaws and export %s=DIR/goaws", EnvBin, Version, EnvBin)
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

// Start starts a server that stops when the test ends (its log shown if the
// test failed), or fails the test when goaws is missing (skips it, under
// -short) or does not start.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Bin()
	if err != nil {
		testdeps.Missing(t, "goaws", "GOBIN=DIR go install github.com/Admiral-Piett/goaws/app/cmd@"+Version+", DIR/cmd renamed DIR/goaws, "+EnvBin+"=DIR/goaws", err)
		return nil
	}
	var lastErr error
	for range 3 { // a free port can be taken between its choice and the start
		s, err := start(bin)
		if err == nil {
			t.Cleanup(func() {
				s.Close()
				if t.Failed() {
					t.Logf("goaws logs:\n%s", s.Logs())
				}
			})
			return s
		}
		lastErr = err
	}
	t.Fatalf("goawstest: %v", lastErr)
	return nil
}

// config is goaws's configuration: one environment (Local, the default)
// on port, with the package's region and account, no queues or topics.
func config(port int) string {
	return fmt.Sprintf(`Local:
  Host: 127.0.0.1
  Port: "%d"
  Region: %s
  AccountId: "%s"
  LogToFile: false
  EnableDuplicates: false
`, port, Region, AccountID)
}

func start(bin string) (*Server, error) {
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "goawstest-")
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "goaws.yaml")
	if err := os.WriteFile(conf, []byte(config(port)), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{
		URL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port,
		dir: dir, logs: &testproc.SyncBuffer{}, done: make(chan struct{}),
	}
	// Without its file goaws would look for a goaws.yaml below its
	// working directory: the temporary directory holds only ours.
	s.cmd = exec.Command(bin, "-config", conf)
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	if err := s.awaitHealthy(10 * time.Second); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// awaitHealthy waits for GET /health to answer OK from this process.
func (s *Server) awaitHealthy(within time.Duration) error {
	client := &http.Client{Timeout: 200 * time.Millisecond}
	deadline := time.Now().Add(within)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("goaws exited before listening on port %d: %s", s.Port, s.logs.String())
		default:
		}
		if resp, err := client.Get(s.URL + "/health"); err == nil {
			resp.Body.Close()
			// The answer is ours only if the process still runs: one that
			// found the port taken exits at once.
			if resp.StatusCode == http.StatusOK && strings.Contains(s.logs.String(), "listening on") {
				select {
				case <-s.done:
				case <-time.After(50 * time.Millisecond):
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("goaws did not answer %s/health within %s: %s", s.URL, within, s.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops the server (SIGTERM, SIGKILL after five seconds).
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
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
}

// Logs returns what goaws logged so far (JSON lines).
func (s *Server) Logs() string { return s.logs.String() }

// Env returns the environment that points the AWS SDK's SNS clients at the
// server: endpoint, static credentials, region, no instance metadata.
func (s *Server) Env() []string {
	return []string{
		"AWS_ENDPOINT_URL_SNS=" + s.URL,
		"AWS_ACCESS_KEY_ID=goawstest",
		"AWS_SECRET_ACCESS_KEY=goawstest-secret",
		"AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// Client returns an SNS client on the server; opts may change its options
// (an HTTPClient that records requests, say).
func (s *Server) Client(opts ...func(*sns.Options)) *sns.Client {
	return sns.NewFromConfig(aws.Config{
		Region:      Region,
		Credentials: credentials.NewStaticCredentialsProvider("goawstest", "goawstest-secret", ""),
	}, append([]func(*sns.Options){func(o *sns.Options) { o.BaseEndpoint = aws.String(s.URL) }}, opts...)...)
}

// CreateTopic creates a topic and returns its ARN, failing t on error.
func (s *Server) CreateTopic(t testing.TB, name string) string {
	t.Helper()
	out, err := s.Client().CreateTopic(context.Background(), &sns.CreateTopicInput{Name: aws.String(name)})
	if err != nil {
		t.Fatalf("creating topic %s: %v", name, err)
	}
	return aws.ToString(out.TopicArn)
}

// Subscribe subscribes an http or https endpoint (by its scheme) to a
// topic and returns the subscription's ARN, failing t on error. goaws posts
// the SubscriptionConfirmation to the endpoint before Subscribe returns.
func (s *Server) Subscribe(t testing.TB, topicARN, endpoint string) string {
	t.Helper()
	protocol, _, ok := strings.Cut(endpoint, "://")
	if !ok {
		t.Fatalf("subscribing %q: not a URL", endpoint)
	}
	out, err := s.Client().Subscribe(context.Background(), &sns.SubscribeInput{
		TopicArn: aws.String(topicARN), Protocol: aws.String(protocol), Endpoint: aws.String(endpoint),
	})
	if err != nil {
		t.Fatalf("subscribing %s to %s: %v", endpoint, topicARN, err)
	}
	return aws.ToString(out.SubscriptionArn)
}
