package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/fleet/ingest/internal/testkit/s3test"
	"github.com/fleet/ingest/internal/testkit/sqstest"
)

// sqsMessages is how many notifications (one folder each) the SQS
// scenario puts on the queue before the consumers start.
const sqsMessages = 10_000

// sqsReceivers is the --receivers of each consumer (its default).
const sqsReceivers = 8

// benchSQS: folders per second imported by "enqueue sqs" processes from a
// queue of S3 notifications (10 messages per receive, --receivers long
// polls per process, the receives that arrive together imported in one
// transaction), 1 and 4 consumers, against pgbench's single-enqueue
// transaction rate with as many clients. The queue is local-aws-sqs
// (Node), whose own speed is part of the figure; the "SQS server alone"
// row measures that ceiling: receive and delete as fast as the server
// answers, no database.
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
	newQueue := func(name string) (string, error) {
		q, err := client.CreateQueue(e.ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: map[string]string{"VisibilityTimeout": "60"}})
		if err != nil {
			return "", err
		}
		queue := aws.ToString(q.QueueUrl)
		return queue, fillQueue(e.ctx, client, queue, sqsMessages)
	}
	var pgbench4, pg4PerFolder float64
	for _, consumers := range []int{1, 4} {
		if err := e.reset(); err != nil {
			return err
		}
		queue, err := newQueue(fmt.Sprintf("bench-%d", consumers))
		if err != nil {
			return err
		}
		start := time.Now()
		cpu := startCPU(e, srv)
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
				"--receivers", fmt.Sprint(sqsReceivers), "--admin-listen", "127.0.0.1:0", "--max-conns", "2", "--log-level", "warn")
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
		used := cpu.stop(procs)
		if err != nil {
			return fmt.Errorf("%d consumers imported %d of %d folders: %w", consumers, n, sqsMessages, err)
		}
		// The rate once the first transaction began: the folders of the
		// later transactions over the time from the first transaction's
		// start to the last one's (the database clock), so the processes'
		// start does not count.
		var after int
		var span float64
		if err := e.pool.QueryRow(e.ctx, `
			WITH b AS (SELECT created_at FROM ingestion_batches WHERE `+current+`)
			SELECT count(*) FILTER (WHERE created_at > (SELECT min(created_at) FROM b)),
			       EXTRACT(EPOCH FROM max(created_at) - min(created_at))::float8 FROM b`).Scan(&after, &span); err != nil {
			return err
		}
		ours := float64(after) / span
		if err := e.reset(); err != nil {
			return err
		}
		base, err := e.pgbench(enqueueBaseline, consumers, e.phase)
		if err != nil {
			return err
		}
		if consumers == 4 {
			pgbench4, pg4PerFolder = base, used.postgres/sqsMessages
		}
		target := 0.0
		if consumers == 4 {
			target = 2.0
		}
		e.add(fmt.Sprintf("SQS consumer, 10 messages per receive, %d consumer(s)", consumers), ours, ptr(base), "folders/s", target, false,
			fmt.Sprintf("%d S3 notifications (one folder each) on a local-aws-sqs queue, consumed by %d enqueue sqs process(es), %d long polls each (--receivers); "+
				"the receives that arrive together (--linger 10ms, up to 100 folders) in one ImportMany transaction, then concurrent DeleteMessageBatch calls; "+
				"rate from the first transaction's start to the last one's (%.2fs, database clock; %s from the processes' start: %.0f folders/s); "+
				"CPU per folder: %.0f µs enqueue sqs, %.0f µs local-aws-sqs, %.0f µs PostgreSQL (%.2f of the machine's %d CPUs busy with these three); "+
				"baseline: pgbench single-enqueue transactions with %d client(s), same run; local-aws-sqs answers a receive on a 10 ms poll tick",
				sqsMessages, consumers, sqsReceivers, span, elapsed.Round(time.Millisecond), float64(sqsMessages)/elapsed.Seconds(),
				1e6*used.consumers/sqsMessages, 1e6*used.server/sqsMessages, 1e6*used.postgres/sqsMessages,
				(used.consumers+used.server+used.postgres)/elapsed.Seconds(), runtime.NumCPU(), consumers))
	}

	// The server alone: as many receivers as the 4 consumers have, each
	// receiving ten and deleting them, no database.
	queue, err := newQueue("bench-server-alone")
	if err != nil {
		return err
	}
	serverCPU, clientCPU := procCPUSeconds(srv.Pid()), selfCPUSeconds()
	receives, elapsed, err := drainQueue(e.ctx, client, queue, 4*sqsReceivers)
	if err != nil {
		return err
	}
	serverCPU, clientCPU = procCPUSeconds(srv.Pid())-serverCPU, selfCPUSeconds()-clientCPU
	// The most a consumer could import on this machine if it cost nothing
	// but its two SDK calls per ten messages: the CPUs over the SQS
	// server's, the SDK client's and PostgreSQL's CPU per folder (the
	// 4-consumer row's PostgreSQL figure).
	perFolder := (serverCPU + clientCPU) / sqsMessages
	ceiling := float64(runtime.NumCPU()) / (perFolder + pg4PerFolder)
	e.add(fmt.Sprintf("SQS server alone (receive and delete, no database), %d receivers", 4*sqsReceivers), float64(sqsMessages)/elapsed.Seconds(), ptr(pgbench4), "messages/s", 0, false,
		fmt.Sprintf("the ceiling of the SQS rows: %d messages received (%d receives, %.0f/s) and deleted (DeleteMessageBatch) by %d goroutines of the harness through the SDK, as fast as local-aws-sqs answers, in %s; "+
			"local-aws-sqs used %.0f µs CPU per message (%.2f CPUs), the SDK client (the harness process) %.0f µs; "+
			"so a consumer whose only work were these calls would reach at most %d CPUs / (%.0f + %.0f + %.0f µs PostgreSQL per folder) = %.0f folders/s on this machine, %.2f of the baseline; "+
			"baseline: pgbench single-enqueue transactions with 4 clients (the SQS 4-consumer row's)",
			sqsMessages, receives, float64(receives)/elapsed.Seconds(), 4*sqsReceivers, elapsed.Round(time.Millisecond),
			1e6*serverCPU/sqsMessages, serverCPU/elapsed.Seconds(), 1e6*clientCPU/sqsMessages,
			runtime.NumCPU(), 1e6*serverCPU/sqsMessages, 1e6*clientCPU/sqsMessages, 1e6*pg4PerFolder, ceiling, ceiling/pgbench4))
	return nil
}

// selfCPUSeconds is this process's CPU time (user + system).
func selfCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// cpuUse is the CPU time of the SQS scenario's parts over a run.
type cpuUse struct{ consumers, server, postgres float64 }

type cpuStart struct {
	e      *env
	pid    int
	server float64
	pg     float64
}

func startCPU(e *env, srv *sqstest.Server) cpuStart {
	return cpuStart{e: e, pid: srv.Pid(), server: procCPUSeconds(srv.Pid()), pg: serverCPUSeconds(filepath.Join(e.cluster.Dir, "data"))}
}

// stop returns the CPU time used since start: the exited consumer
// processes' (their rusage), the SQS server's and PostgreSQL's.
func (c cpuStart) stop(procs []*exec.Cmd) cpuUse {
	u := cpuUse{server: procCPUSeconds(c.pid) - c.server, postgres: serverCPUSeconds(filepath.Join(c.e.cluster.Dir, "data")) - c.pg}
	for _, p := range procs {
		if p.ProcessState != nil {
			u.consumers += (p.ProcessState.UserTime() + p.ProcessState.SystemTime()).Seconds()
		}
	}
	return u
}

// procCPUSeconds is a live process's CPU time (user + system).
func procCPUSeconds(pid int) float64 {
	f, ok := procStat(pid)
	if !ok {
		return 0
	}
	return float64(f.utime+f.stime) / clockTicks
}

// drainQueue receives (ten at a time) and deletes every message of queue
// with receivers goroutines, and returns the receives made and the time.
func drainQueue(ctx context.Context, client *sqs.Client, queue string, receivers int) (int, time.Duration, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		receives int
		left     = sqsMessages
		firstErr error
		end      time.Time
	)
	start := time.Now()
	for range receivers {
		wg.Go(func() {
			for {
				mu.Lock()
				done := left <= 0 || firstErr != nil
				mu.Unlock()
				if done {
					return
				}
				out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(queue), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
				if err == nil && len(out.Messages) > 0 {
					entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
					for i, m := range out.Messages {
						entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle}
					}
					_, err = client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(queue), Entries: entries})
				}
				mu.Lock()
				receives++
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					left -= len(out.Messages)
					if left <= 0 && end.IsZero() {
						end = time.Now()
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return receives, end.Sub(start), firstErr
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
	// Every 100 ms: the count is a scan, and its CPU is PostgreSQL's in the
	// scenario's figures.
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
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

	// The gofakes3 server answers a page in about a millisecond; S3 takes
	// tens of milliseconds per page of 1,000 keys. The second pair of runs
	// gives every page an assumed 50 ms, to show what bounds a scan
	// against a server of S3's speed.
	for _, latency := range []time.Duration{0, 50 * time.Millisecond} {
		store.SlowListing(bucket, latency)
		start := time.Now()
		listed := 0
		// The request reconcile makes: URL-encoded keys (they are only
		// counted here, not decoded).
		pages := s3.NewListObjectsV2Paginator(store.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String("tenants/"), EncodingType: s3types.EncodingTypeUrl})
		for pages.HasMorePages() {
			page, err := pages.NextPage(e.ctx)
			if err != nil {
				return err
			}
			listed += len(page.Contents)
		}
		listOnly := float64(listed) / time.Since(start).Seconds()
		server := "gofakes3 in the harness"
		suffix := ""
		if latency > 0 {
			server = fmt.Sprintf("gofakes3 in the harness with %s per listing page (an assumed S3 page latency)", latency)
			suffix = fmt.Sprintf(", %s per listing page", latency)
		}

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
			// Bounded by the S3 server: where nothing is to enqueue (the
			// steady state), a scan against pages of S3's latency lasts
			// about as long as its listing.
			target := 0.0
			if latency > 0 && run.outcome == "running" {
				target = 0.8
			}
			peak := sum.peaks.hwm
			e.add(fmt.Sprintf("reconcile over 10,000 folders, %s%s", run.label, suffix), float64(reconcileFolders)/sum.DurationSeconds, ptr(listOnly*float64(reconcileFolders)/float64(listed)), "folders/s", target, false,
				fmt.Sprintf("enqueue reconcile process, bursts of 500 folders (one look-up, one ImportMany), the next page listed while one is reconciled; %d objects listed in %.2fs (%.0f objects/s); baseline: the same ListObjectsV2 pages through the SDK from the harness, %.0f objects/s, no database; S3 is %s; peak resident memory of the process %.1f MiB",
					sum.ObjectsListed, sum.DurationSeconds, objectsPerSecond, listOnly, server, peak))
			e.addTarget(fmt.Sprintf("reconcile over 10,000 folders, %s%s: peak memory", run.label, suffix), peak, "MiB", "<= 64 MiB", peak <= 64,
				fmt.Sprintf("the enqueue reconcile process's peak resident set (VmHWM of /proc/<pid>/status, its largest value sampled every 5 ms until the exit), %d objects listed a page at a time, bursts of 500 folders; "+
					"of it at most %.1f MiB anonymous (heap, stacks) and %.1f MiB file-backed (pages of the executable)",
					sum.ObjectsListed, sum.peaks.anon, sum.peaks.file))
		}
	}
	return nil
}

// reconcileSummary is the summary line of enqueue reconcile.
type reconcileSummary struct {
	ObjectsListed   int            `json:"objects_listed"`
	Outcomes        map[string]int `json:"outcomes"`
	DurationSeconds float64        `json:"duration_seconds"`
	// peaks is the process's memory, sampled (not in the line).
	peaks memPeaks
}

// memPeaks are the largest values of /proc/<pid>/status seen, in MiB:
// VmHWM (the high-water mark of the resident set, kept by the kernel
// between samples), and the largest anonymous (heap, stacks) and
// file-backed (pages of the executable) parts. Not ru_maxrss: for a child
// started with vfork, as os/exec does, Linux counts the parent's resident
// set at the exec in it.
type memPeaks struct{ hwm, anon, file float64 }

// sampleMemory reads /proc/<pid>/status every 5 ms until exited closes.
func sampleMemory(pid int, exited <-chan struct{}) memPeaks {
	var p memPeaks
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			for _, line := range strings.Split(string(raw), "\n") {
				var kb float64
				if _, err := fmt.Sscanf(line, "VmHWM: %f kB", &kb); err == nil {
					p.hwm = max(p.hwm, kb/1024)
				}
				if _, err := fmt.Sscanf(line, "RssAnon: %f kB", &kb); err == nil {
					p.anon = max(p.anon, kb/1024)
				}
				if _, err := fmt.Sscanf(line, "RssFile: %f kB", &kb); err == nil {
					p.file = max(p.file, kb/1024)
				}
			}
		}
		select {
		case <-exited:
			return p
		case <-tick.C:
		}
	}
}

func (e *env) runReconcile(store *s3test.Server, bucket string) (reconcileSummary, error) {
	cmd := exec.CommandContext(e.ctx, e.enqueueBin, "reconcile", "--bucket", bucket, "--prefix", "tenants/", "--log-level", "warn")
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+e.dbURL), store.Env()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return reconcileSummary{}, fmt.Errorf("enqueue reconcile: %w", err)
	}
	sampled := make(chan memPeaks, 1)
	exited := make(chan struct{})
	go func() { sampled <- sampleMemory(cmd.Process.Pid, exited) }()
	err := cmd.Wait()
	close(exited)
	peaks := <-sampled
	if err != nil {
		return reconcileSummary{}, fmt.Errorf("enqueue reconcile: %v: %s", err, stderr.String())
	}
	if peaks.hwm == 0 {
		return reconcileSummary{}, errors.New("enqueue reconcile: its memory could not be sampled")
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
		line.Summary.peaks = peaks
		return line.Summary, nil
	}
	return reconcileSummary{}, fmt.Errorf("enqueue reconcile printed no summary: %s", stderr.String())
}
