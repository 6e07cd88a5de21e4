package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/fleet/ingest/internal/s3test"
	"github.com/fleet/ingest/internal/sqstest"
)

// sqsMessages is how many notifications (one folder each) the SQS
// scenario puts on the queue before the consumers start.
const sqsMessages = 3000

// benchSQS: folders per second imported by "enqueue sqs" processes from a
// queue of S3 notifications (10 messages per receive, their folders in one
// transaction), 1 and 4 consumers, against pgbench's single-enqueue
// transaction rate with as many clients. The queue is local-aws-sqs (Node),
// whose own speed is part of the figure.
func benchSQS(e *env) error {
	srv, err := sqstest.New()
	if err != nil {
		if os.Getenv(sqstest.DirEnv) == "" {
			e.log.Warn("SQS scenario skipped: local-aws-sqs not installed", "error", err)
			return nil
		}
		return err
	}
	defer srv.Close()
	client := srv.Client()
	for _, consumers := range []int{1, 4} {
		if err := e.reset(); err != nil {
			return err
		}
		q, err := client.CreateQueue(e.ctx, &sqs.CreateQueueInput{QueueName: aws.String(fmt.Sprintf("bench-%d", consumers)),
			Attributes: map[string]string{"VisibilityTimeout": "60"}})
		if err != nil {
			return err
		}
		queue := aws.ToString(q.QueueUrl)
		if err := fillQueue(e.ctx, client, queue, sqsMessages); err != nil {
			return err
		}
		start := time.Now()
		var procs []*exec.Cmd
		stop := func() {
			for _, p := range procs {
				_ = p.Process.Signal(syscall.SIGTERM)
			}
			for _, p := range procs {
				_ = p.Wait()
			}
		}
		for i := range consumers {
			logs, err := os.CreateTemp(e.dir, "sqs-*.log")
			if err != nil {
				stop()
				return err
			}
			cmd := exec.Command(e.enqueueBin, "sqs", "--queue-url", queue, "--bucket", "bench-bucket", "--wait-time", "1s",
				"--admin-listen", "127.0.0.1:0", "--max-conns", "2", "--log-level", "warn")
			cmd.Env = append(append(os.Environ(), "DATABASE_URL="+e.dbURL), srv.Env()...)
			cmd.Stdout, cmd.Stderr = logs, logs
			if err := cmd.Start(); err != nil {
				stop()
				return fmt.Errorf("consumer %d: %w", i, err)
			}
			procs = append(procs, cmd)
		}
		n, err := e.waitBatches(sqsMessages, 5*time.Minute)
		elapsed := time.Since(start)
		stop()
		if err != nil {
			return fmt.Errorf("%d consumers imported %d of %d folders: %w", consumers, n, sqsMessages, err)
		}
		ours := float64(sqsMessages) / elapsed.Seconds()
		if err := e.reset(); err != nil {
			return err
		}
		base, err := e.pgbench(enqueueBaseline, consumers, e.phase)
		if err != nil {
			return err
		}
		e.add(fmt.Sprintf("SQS consumer, 10 messages per receive, %d consumer(s)", consumers), ours, ptr(base), "folders/s", 0, false,
			fmt.Sprintf("%d S3 notifications (one folder each) on a local-aws-sqs queue, consumed by %d enqueue sqs process(es) from their start until every folder had a batch (%s, process start included); "+
				"each receive's folders in one ImportMany transaction, then DeleteMessageBatch; baseline: pgbench single-enqueue transactions with %d client(s), same run; local-aws-sqs answers a receive on its next 10 ms poll tick, so one consumer waits at least 10 ms per 10 messages",
				sqsMessages, consumers, elapsed.Round(time.Millisecond), consumers))
	}
	return nil
}

// fillQueue sends n notifications of distinct folders, ten per request,
// from four senders.
func fillQueue(ctx context.Context, client *sqs.Client, queue string, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for start := w * 10; start < n; start += 40 {
				var entries []types.SendMessageBatchRequestEntry
				for i := start; i < min(start+10, n); i++ {
					key := fmt.Sprintf("tenants/tenant-bench/tenant_db/company-1/sqs-%06d/_SUCCESS", i)
					entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i - start)), MessageBody: aws.String(sqstest.S3Event("bench-bucket", key))})
				}
				out, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queue), Entries: entries})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("%d entries failed", len(out.Failed))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// waitBatches waits until the scenario's batches number n.
func (e *env) waitBatches(n int, timeout time.Duration) (int, error) {
	var got int
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM ingestion_batches WHERE `+current).Scan(&got); err != nil {
			return got, err
		}
		if got >= n {
			return got, nil
		}
	}
	return got, fmt.Errorf("timed out after %s", timeout)
}

// reconcileFolders is how many completed folders the reconcile scenario
// lists.
const reconcileFolders = 10_000

// benchReconcile: folders per second an "enqueue reconcile" process
// reconciles over 10,000 completed folders (gofakes3 in the harness, the
// real AWS SDK in the process): first when none has a batch (each looked up
// and enqueued), then again when all are running (looked up only); the
// baseline is the same listing alone through the SDK from the harness.
func benchReconcile(e *env) error {
	store := s3test.New()
	defer store.Close()
	const bucket = "bench-reconcile"
	if _, err := store.Client().CreateBucket(e.ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return err
	}
	keys := make([]string, 0, reconcileFolders*11/10)
	for i := range reconcileFolders {
		dir := fmt.Sprintf("tenants/tenant-%d/tenant_db/company-1/upload-%06d", i%200, i)
		keys = append(keys, dir+"/_SUCCESS")
		if i%10 == 0 {
			keys = append(keys, dir+"/trips.csv")
		}
	}
	if err := store.PutAll(bucket, keys, nil); err != nil {
		return err
	}

	start := time.Now()
	listed := 0
	pages := s3.NewListObjectsV2Paginator(store.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String("tenants/")})
	for pages.HasMorePages() {
		page, err := pages.NextPage(e.ctx)
		if err != nil {
			return err
		}
		listed += len(page.Contents)
	}
	listOnly := float64(listed) / time.Since(start).Seconds()

	if err := e.reset(); err != nil {
		return err
	}
	for _, run := range []struct{ label, outcome string }{
		{"no folder has a batch (all enqueued)", "enqueued"},
		{"every folder has a running batch (looked up only)", "running"},
	} {
		sum, err := e.runReconcile(store, bucket)
		if err != nil {
			return err
		}
		if sum.Outcomes[run.outcome] != reconcileFolders {
			return fmt.Errorf("reconcile: %v, want %d %s", sum.Outcomes, reconcileFolders, run.outcome)
		}
		objectsPerSecond := float64(sum.ObjectsListed) / sum.DurationSeconds
		e.add(fmt.Sprintf("reconcile over 10,000 folders, %s", run.label), float64(reconcileFolders)/sum.DurationSeconds, ptr(listOnly*float64(reconcileFolders)/float64(listed)), "folders/s", 0, false,
			fmt.Sprintf("enqueue reconcile process, bursts of 500 folders (one look-up, one ImportMany); %d objects listed in %.2fs (%.0f objects/s); baseline: the same ListObjectsV2 pages through the SDK from the harness, %.0f objects/s, no database; S3 is gofakes3 in the harness",
				sum.ObjectsListed, sum.DurationSeconds, objectsPerSecond, listOnly))
	}
	return nil
}

// reconcileSummary is the summary line of enqueue reconcile.
type reconcileSummary struct {
	ObjectsListed   int            `json:"objects_listed"`
	Outcomes        map[string]int `json:"outcomes"`
	DurationSeconds float64        `json:"duration_seconds"`
}

func (e *env) runReconcile(store *s3test.Server, bucket string) (reconcileSummary, error) {
	cmd := exec.CommandContext(e.ctx, e.enqueueBin, "reconcile", "--bucket", bucket, "--prefix", "tenants/", "--log-level", "warn")
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+e.dbURL), store.Env()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return reconcileSummary{}, fmt.Errorf("enqueue reconcile: %v: %s", err, stderr.String())
	}
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), `{"summary"`) {
			continue
		}
		var line struct{ Summary reconcileSummary }
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return reconcileSummary{}, err
		}
		return line.Summary, nil
	}
	return reconcileSummary{}, fmt.Errorf("enqueue reconcile printed no summary: %s", stderr.String())
}
