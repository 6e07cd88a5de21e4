// Package redshifttest is a Redshift Data API double for tests: an
// in-process HTTP server that speaks the Data API's JSON protocol
// (X-Amz-Target: RedshiftData.<Operation>) to the real redshiftdata client
// through an endpoint override, backed by a PostgreSQL database of its own.
//
// It implements ExecuteStatement, BatchExecuteStatement, DescribeStatement,
// GetStatementResult and CancelStatement. A ClientToken is honoured: a
// submission repeating an earlier one's token is answered with that
// statement (counted by Repeats), and refused (ValidationException) if its
// request differs. Statements run asynchronously, as
// on Redshift: a submission answers with an id at once, the work continues
// whatever the client does, and DescribeStatement reports SUBMITTED,
// STARTED, then FINISHED, FAILED (with Error) or ABORTED. A
// BatchExecuteStatement runs as one PostgreSQL transaction (serializable):
// if one statement fails, none takes effect. COPY … FROM '<manifest>'
// IAM_ROLE … MANIFEST FORMAT AS JSON 'auto' GZIP reads the manifest and
// every part it names from S3 (an s3test server), refuses a missing
// mandatory part or a size that differs from meta.content_length, maps
// top-level JSON keys to the listed columns, and enforces Redshift's 4 MB
// JSON object and 65,535-byte SUPER string limits; a number beyond DOUBLE
// PRECISION's range in a SUPER value (1e400) fails the COPY. Redshift SQL is
// translated for PostgreSQL: SUPER becomes jsonb, IDENTITY(s, i) an
// identity column, SYSDATE and GETDATE() the transaction's and statement's
// UTC time; DISTSTYLE, DISTKEY, SORTKEY and ENCODE are dropped, and so are
// PRIMARY KEY and UNIQUE table constraints, which Redshift never enforces;
// named parameters (:name) become bind parameters.
//
// It refuses, as the Data API documents: a statement over 100 KB, a batch
// of more than 40 statements, a submission while 200 statements are active
// (ActiveStatementsExceededException), Parameters on a request holding
// anything but SELECT, INSERT, UPDATE and DELETE (LOCK, COPY, CREATE …:
// ValidationException), and — stricter than documented, to catch values
// spliced into text — a :name inside a string literal of a parameterised
// request. Statements go SUBMITTED, PICKED, STARTED, then end. String
// literals are read as Redshift reads them: a backslash escapes the next
// character (they run as PostgreSQL E” strings).
//
// Faults (Inject): fail the Nth statement of a batch with a given error
// (for example Redshift's "ERROR: 1023 … Serializable isolation violation"),
// end it ABORTED, hold a transaction open before its commit until the test
// releases it (a commit after the client's deadline, or after the client
// died), keep reporting STARTED after the transaction ended (a client
// that never sees the outcome), or hold a batch's COPY for a while before
// it reads S3 (CopyDelay: a long COPY, with whatever its transaction
// locked still locked). Throttle answers the next requests with
// ThrottlingException.
//
// Database users (Options.Identities): a submission runs as the user its
// SecretArn, DbUser or (IAM-derived) access key names, a PostgreSQL role of
// its own created without privileges and made a member of the Redshift
// roles listed for it (CREATE ROLE and GRANT … TO ROLE in a migration
// become prefixed PostgreSQL roles, dropped when the double closes), so a
// missing grant fails as it would on Redshift.
//
// What it does not emulate: authentication and IAM (credentials and
// secrets are never verified, IAM policies and principal tags are not
// read: the roles of each user are given in Options.Identities; the COPY
// role is not assumed, the double reads S3 with its own client;
// PostgreSQL's privilege rules stand in for Redshift's, e.g. LOCK needs
// UPDATE or DELETE on the table); Redshift's SQL dialect beyond the translations above, its type
// system (SUPER is jsonb: PartiQL navigation, SUPER's own number and string
// semantics and its 16 MB object limit are not there), its planner, and its
// implicit casts of Data API parameters (PostgreSQL infers parameter types
// instead); Redshift's locking and isolation (PostgreSQL's serializable
// snapshot isolation and lock modes stand in; LOCK blocks readers as
// Redshift's does); COPY options other than the form above, COPY's
// parallel slices, stl_load_errors, MAXERROR, ACCEPTINVCHARS and JSON
// paths; Data API limits beyond those it refuses (see below: 24 h runtime,
// result retention and result size are not checked),
// result pagination (one page), sessions (SessionId, SessionKeepAlive),
// ListStatements, DescribeTable, events, and the Data API's own rate limits
// (only the injected throttling). It is for tests only and never linked into
// the binaries (cmd/worker's tests check).
package redshifttest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Data API limits the double enforces.
const (
	// maxStatementBytes is the limit on one statement's text (100 KB).
	maxStatementBytes = 100_000
	// maxBatchStatements is the most statements one BatchExecuteStatement
	// takes.
	maxBatchStatements = 40
	// maxActiveStatements is the most statements a cluster or workgroup
	// runs at once (SUBMITTED, PICKED or STARTED); the next submission is
	// refused with ActiveStatementsExceededException.
	maxActiveStatements = 200
)

// parameterised are the statements the Data API documents parameters
// for: a request with Parameters is refused if any of its statements is
// another kind (LOCK, COPY, CREATE, DROP …).
var parameterised = map[string]bool{"SELECT": true, "INSERT": true, "UPDATE": true, "DELETE": true}

// firstKeyword returns a statement's first word, upper-cased, skipping
// whitespace and -- comments.
func firstKeyword(sql string) string {
	for {
		sql = strings.TrimLeft(sql, " \t\r\n(")
		if !strings.HasPrefix(sql, "--") {
			break
		}
		_, rest, ok := strings.Cut(sql, "\n")
		if !ok {
			return ""
		}
		sql = rest
	}
	end := strings.IndexFunc(sql, func(r rune) bool { return !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z') })
	if end < 0 {
		end = len(sql)
	}
	return strings.ToUpper(sql[:end])
}

// placeholderInLiteral finds a :name inside a string literal, which a
// parameterised request must not have (the Data API would not bind it, and
// a value that looked like one is a sign values were spliced into text).
var placeholderInLiteral = regexp.MustCompile(`:[A-Za-z_][A-Za-z0-9_]*`)

func literalPlaceholder(sql string) string {
	inQuote := false
	start := 0
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case inQuote && c == '\\':
			i++
		case c == '\'' && inQuote && i+1 < len(sql) && sql[i+1] == '\'':
			i++
		case c == '\'':
			if inQuote {
				if m := placeholderInLiteral.FindString(sql[start:i]); m != "" {
					return m
				}
			}
			inQuote, start = !inQuote, i+1
		}
	}
	return ""
}

// Options configure a Double.
type Options struct {
	// DatabaseURL is a PostgreSQL database the double owns (empty at
	// first: "worker migrate --warehouse redshift" creates schema curated).
	DatabaseURL string
	// S3 reads manifests and staging parts.
	S3 *s3.Client
	// Workgroup, Cluster and Database, when set, are the only target the
	// double accepts.
	Workgroup, Cluster, Database string
	// Identities, when set, model database users: a submission runs as
	// the user its credentials name (IdentityKey), which holds only the
	// privileges of the Redshift roles listed for it, so a missing GRANT
	// fails as it would on Redshift; credentials not listed are refused.
	// Unset, every submission runs as the warehouse's owner.
	Identities map[string]Identity
}

// Double is an in-process Redshift Data API.
type Double struct {
	// URL is the endpoint to give the redshiftdata client.
	URL string
	// Pool is the double's own database, for tests to look into.
	Pool *pgxpool.Pool

	opts Options
	srv  *httptest.Server
	wg   sync.WaitGroup
	ctx  context.Context
	stop context.CancelFunc

	mu sync.Mutex
	// provision serializes the creation of database users and their role
	// grants (pgUser): PostgreSQL refuses two concurrent GRANTs of one
	// membership with a unique violation, which a Redshift user never sees.
	provision  sync.Mutex
	statements map[string]*statement
	tokens     map[string]string
	faults     []*Injection
	throttle   int
	submitted  []Submission
	repeats    int
	describes  map[string]int
	rolePrefix string
	users      map[string]bool
}

// Submission records one ExecuteStatement or BatchExecuteStatement request.
type Submission struct {
	ID                           string
	Name                         string
	SQLs                         []string
	Params                       map[string]string
	Workgroup, Cluster, Database string
	SecretARN, DBUser            string
	ClientToken                  string
}

// Fault is a failure to inject into the next batch that matches.
type Fault struct {
	// Match selects the batch: one of its statements contains this text
	// (case-insensitive). Empty matches the next batch. Single statements
	// (ExecuteStatement) are never matched.
	Match string
	// FailAt is the 1-based statement of the batch that fails with Error;
	// 0 fails none.
	FailAt int
	// Error is the failing statement's error text. Defaults to
	// "ERROR: injected failure".
	Error string
	// Abort ends the batch ABORTED at FailAt instead of FAILED.
	Abort bool
	// Hold, if set, keeps the transaction open after its statements ran,
	// before its commit, until Release.
	Hold bool
	// HideOutcome keeps DescribeStatement answering STARTED after the
	// transaction ended, until Reveal; it answers only once the
	// transaction has ended.
	HideOutcome bool
	// CopyDelay holds each COPY of the batch this long before it reads
	// S3, as a COPY of a large folder takes minutes on Redshift; whatever
	// the transaction locked before it stays locked meanwhile.
	CopyDelay time.Duration
}

// Injection is an injected fault in flight.
type Injection struct {
	Fault
	matched  chan string
	held     chan struct{}
	release  chan struct{}
	reveal   chan struct{}
	done     chan struct{}
	copying  chan struct{}
	copyOnce sync.Once
	relOnce  sync.Once
	revOnce  sync.Once
	heldOnce sync.Once
}

// Matched returns the id of the batch the fault was applied to, once it was.
func (f *Injection) Matched() <-chan string { return f.matched }

// Held is closed when a Hold fault's transaction ran its statements and
// waits for Release.
func (f *Injection) Held() <-chan struct{} { return f.held }

// Copying is closed when a CopyDelay fault's COPY starts its delay.
func (f *Injection) Copying() <-chan struct{} { return f.copying }

// Release lets a held transaction commit.
func (f *Injection) Release() { f.relOnce.Do(func() { close(f.release) }) }

// Reveal lets DescribeStatement report a hidden outcome.
func (f *Injection) Reveal() { f.revOnce.Do(func() { close(f.reveal) }) }

// Done is closed when the batch's transaction ended (committed or rolled
// back), whatever DescribeStatement says.
func (f *Injection) Done() <-chan struct{} { return f.done }

// statement is one submitted statement or batch.
type statement struct {
	identity Identity
	id       string
	batch    bool
	sqls     []string
	params   map[string]string
	target   Submission
	created  time.Time

	mu      sync.Mutex
	status  string
	errText string
	updated time.Time
	subs    []*subStatement
	cancel  context.CancelFunc
	fault   *Injection
}

type subStatement struct {
	status  string
	errText string
	rows    int64
	result  *result
}

type result struct {
	columns []column
	records [][]map[string]any
}

type column struct {
	Name     string `json:"name"`
	TypeName string `json:"typeName"`
}

// Start starts a double that stops when the test ends.
func Start(t testing.TB, opts Options) *Double {
	t.Helper()
	d, err := New(opts)
	if err != nil {
		t.Fatalf("starting the Redshift Data API double: %v", err)
	}
	t.Cleanup(d.Close)
	return d
}

// New starts a double; Close stops it.
func New(opts Options) (*Double, error) {
	cfg, err := pgxpool.ParseConfig(opts.DatabaseURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	d := &Double{Pool: pool, opts: opts, ctx: ctx, stop: stop, statements: map[string]*statement{}, tokens: map[string]string{}, describes: map[string]int{},
		rolePrefix: newRolePrefix(), users: map[string]bool{}}
	d.srv = httptest.NewServer(http.HandlerFunc(d.serve))
	d.URL = d.srv.URL
	return d, nil
}

// Close stops the server and every running statement.
func (d *Double) Close() {
	d.srv.Close()
	d.stop()
	d.mu.Lock()
	for _, f := range d.faults {
		f.Release()
		f.Reveal()
	}
	d.mu.Unlock()
	d.wg.Wait()
	d.dropRoles()
	d.Pool.Close()
}

// Client returns a redshiftdata client on the double.
func (d *Double) Client() *redshiftdata.Client {
	return redshiftdata.New(redshiftdata.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("double", "double-secret", ""),
		BaseEndpoint: aws.String(d.URL),
	})
}

// Env returns the environment pointing a process's redshiftdata clients at
// the double (add the S3 server's too).
func (d *Double) Env() []string {
	return []string{"AWS_ENDPOINT_URL_REDSHIFT_DATA=" + d.URL}
}

// Inject arms a fault for the next matching batch.
func (d *Double) Inject(f Fault) *Injection {
	in := &Injection{Fault: f, matched: make(chan string, 1), held: make(chan struct{}), release: make(chan struct{}),
		reveal: make(chan struct{}), done: make(chan struct{}), copying: make(chan struct{})}
	if !f.Hold {
		close(in.release)
	}
	if !f.HideOutcome {
		close(in.reveal)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults = append(d.faults, in)
	return in
}

// Throttle answers the next n requests with ThrottlingException.
func (d *Double) Throttle(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.throttle = n
}

// Repeats counts the submissions answered with the statement an earlier
// submission of the same ClientToken started.
func (d *Double) Repeats() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.repeats
}

// Active counts the statements still SUBMITTED, PICKED or STARTED (the
// ones the limit of 200 counts).
func (d *Double) Active() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.active()
}

// Describes counts the DescribeStatement requests for a statement id.
func (d *Double) Describes(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.describes[id]
}

// Submissions returns the requests that submitted statements, in order.
func (d *Double) Submissions() []Submission {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Submission(nil), d.submitted...)
}

// apiError is a Data API error answer.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }

func validation(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, "ValidationException", fmt.Sprintf(format, args...)}
}

func (d *Double) serve(w http.ResponseWriter, r *http.Request) {
	op, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), "RedshiftData.")
	body, err := io.ReadAll(r.Body)
	if r.Method != http.MethodPost || !ok || err != nil {
		writeError(w, &apiError{http.StatusBadRequest, "UnknownOperationException", "not a Data API request"})
		return
	}
	d.mu.Lock()
	throttled := d.throttle > 0
	if throttled {
		d.throttle--
	}
	d.mu.Unlock()
	if throttled {
		writeError(w, &apiError{http.StatusBadRequest, "ThrottlingException", "Rate exceeded"})
		return
	}
	var out any
	switch op {
	case "ExecuteStatement", "BatchExecuteStatement":
		out, err = d.submit(op == "BatchExecuteStatement", body, accessKeyID(r))
	case "DescribeStatement":
		out, err = d.describe(r.Context(), body)
	case "GetStatementResult":
		out, err = d.result(body)
	case "CancelStatement":
		out, err = d.cancel(body)
	default:
		err = &apiError{http.StatusBadRequest, "UnknownOperationException", op + " is not implemented by the double"}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(out)
}

func writeError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{http.StatusInternalServerError, "InternalServerException", err.Error()}
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", ae.code)
	w.WriteHeader(ae.status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": ae.code, "message": ae.msg})
}

var paramName = regexp.MustCompile(`^[0-9a-zA-Z_]+$`)

type submitRequest struct {
	SQL               string `json:"Sql"`
	SQLs              []string
	Parameters        []struct{ Name, Value string } `json:"Parameters"`
	ClientToken       string
	ClusterIdentifier string
	Database          string
	DbUser            string
	SecretArn         string
	WorkgroupName     string
	StatementName     string
}

func (d *Double) submit(batch bool, body []byte, accessKey string) (any, error) {
	var req submitRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, validation("malformed request: %v", err)
	}
	sqls := req.SQLs
	if !batch {
		sqls = []string{req.SQL}
	}
	switch {
	case len(sqls) == 0 || (len(sqls) == 1 && strings.TrimSpace(sqls[0]) == ""):
		return nil, validation("no SQL")
	case req.Database == "":
		return nil, validation("Database is required")
	case (req.WorkgroupName == "") == (req.ClusterIdentifier == ""):
		return nil, validation("exactly one of WorkgroupName and ClusterIdentifier is required")
	case req.SecretArn != "" && req.DbUser != "":
		return nil, validation("SecretArn and DbUser are exclusive")
	case req.DbUser != "" && req.ClusterIdentifier == "":
		return nil, validation("DbUser requires ClusterIdentifier")
	case d.opts.Workgroup != "" && req.WorkgroupName != d.opts.Workgroup:
		return nil, &apiError{http.StatusBadRequest, "ResourceNotFoundException", fmt.Sprintf("workgroup %q not found", req.WorkgroupName)}
	case d.opts.Cluster != "" && req.ClusterIdentifier != d.opts.Cluster:
		return nil, &apiError{http.StatusBadRequest, "ResourceNotFoundException", fmt.Sprintf("cluster %q not found", req.ClusterIdentifier)}
	case d.opts.Database != "" && req.Database != d.opts.Database:
		return nil, validation("database %q does not exist", req.Database)
	}
	ident, err := d.identityOf(IdentityKey(req.SecretArn, req.DbUser, accessKey))
	if err != nil {
		return nil, err
	}
	if batch && len(sqls) > maxBatchStatements {
		return nil, validation("a batch takes at most %d statements, not %d", maxBatchStatements, len(sqls))
	}
	params := map[string]string{}
	for _, p := range req.Parameters {
		if !paramName.MatchString(p.Name) || p.Value == "" {
			return nil, validation("parameter %q: names match [0-9a-zA-Z_]+ and values are not empty", p.Name)
		}
		params[p.Name] = p.Value
	}
	for _, s := range sqls {
		if len(s) > maxStatementBytes {
			return nil, validation("the SQL statement is %d bytes, over the %d byte limit", len(s), maxStatementBytes)
		}
		if len(req.Parameters) > 0 {
			if kw := firstKeyword(s); !parameterised[kw] {
				return nil, validation("parameters are supported for SELECT, INSERT, UPDATE and DELETE only, not %s", kw)
			}
			if m := literalPlaceholder(s); m != "" {
				return nil, validation("%s appears inside a string literal of a parameterised statement", m)
			}
		}
		if _, _, err := translate(s, params); err != nil {
			return nil, validation("%v", err)
		}
	}

	d.mu.Lock()
	if id, ok := d.tokens[req.ClientToken]; ok && req.ClientToken != "" {
		st := d.statements[id]
		same := st.batch == batch && slices.Equal(st.sqls, sqls) && maps.Equal(st.params, params) &&
			st.target.Workgroup == req.WorkgroupName && st.target.Cluster == req.ClusterIdentifier && st.target.Database == req.Database &&
			st.target.SecretARN == req.SecretArn && st.target.DBUser == req.DbUser
		if !same {
			d.mu.Unlock()
			return nil, validation("ClientToken %q was used for a different request", req.ClientToken)
		}
		d.repeats++
		d.mu.Unlock()
		return submitAnswer(st), nil
	}
	if active := d.active(); active >= maxActiveStatements {
		d.mu.Unlock()
		return nil, &apiError{http.StatusBadRequest, "ActiveStatementsExceededException",
			fmt.Sprintf("The number of active statements exceeds the limit of %d", maxActiveStatements)}
	}
	st := &statement{
		identity: ident,
		id:       newID(), batch: batch, sqls: sqls, params: params, created: time.Now(), status: "SUBMITTED",
		target: Submission{Name: req.StatementName, SQLs: sqls, Params: params, Workgroup: req.WorkgroupName,
			Cluster: req.ClusterIdentifier, Database: req.Database, SecretARN: req.SecretArn, DBUser: req.DbUser, ClientToken: req.ClientToken},
	}
	st.target.ID = st.id
	st.updated = st.created
	for range sqls {
		st.subs = append(st.subs, &subStatement{status: "SUBMITTED"})
	}
	if batch {
		for i, f := range d.faults {
			if f.Match == "" || containsFold(sqls, f.Match) {
				st.fault = f
				d.faults = append(d.faults[:i], d.faults[i+1:]...)
				f.matched <- st.id
				break
			}
		}
	}
	d.statements[st.id] = st
	if req.ClientToken != "" {
		d.tokens[req.ClientToken] = st.id
	}
	d.submitted = append(d.submitted, st.target)
	ctx, cancel := context.WithCancel(d.ctx)
	st.cancel = cancel
	d.wg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		defer cancel()
		d.run(ctx, st)
	}()
	return submitAnswer(st), nil
}

// active counts the statements SUBMITTED, PICKED or STARTED. d.mu is held.
func (d *Double) active() int {
	n := 0
	for _, st := range d.statements {
		st.mu.Lock()
		switch st.status {
		case "SUBMITTED", "PICKED", "STARTED":
			n++
		}
		st.mu.Unlock()
	}
	return n
}

func containsFold(sqls []string, sub string) bool {
	for _, s := range sqls {
		if strings.Contains(strings.ToLower(s), strings.ToLower(sub)) {
			return true
		}
	}
	return false
}

func submitAnswer(st *statement) map[string]any {
	out := map[string]any{"Id": st.id, "CreatedAt": epoch(st.created), "Database": st.target.Database}
	if st.target.Workgroup != "" {
		out["WorkgroupName"] = st.target.Workgroup
	} else {
		out["ClusterIdentifier"] = st.target.Cluster
	}
	return out
}

func epoch(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// run executes a statement (or batch) as one transaction.
func (d *Double) run(ctx context.Context, st *statement) {
	f := st.fault
	st.set(func() { st.status = "PICKED" })
	st.set(func() { st.status = "STARTED" })
	err := d.runTx(ctx, st)
	if f != nil {
		close(f.done) // the transaction has ended, whatever is reported
	}
	final := "FINISHED"
	var msg string
	switch {
	case err == nil:
	case ctx.Err() != nil || errors.Is(err, errAborted):
		final, msg = "ABORTED", "Query (statement) cancelled on user's request"
	default:
		final, msg = "FAILED", err.Error()
	}
	if f != nil && f.HideOutcome {
		select {
		case <-f.reveal:
		case <-d.ctx.Done():
		}
	}
	st.set(func() {
		st.status, st.errText = final, msg
		for _, sub := range st.subs {
			if sub.status == "SUBMITTED" || sub.status == "PICKED" || sub.status == "STARTED" {
				sub.status = map[bool]string{true: "FINISHED", false: "ABORTED"}[final == "FINISHED"]
			}
		}
	})
}

var errAborted = errors.New("aborted")

func (st *statement) set(f func()) {
	st.mu.Lock()
	defer st.mu.Unlock()
	f()
	st.updated = time.Now()
}

func (d *Double) runTx(ctx context.Context, st *statement) error {
	tx, err := d.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		return fmt.Errorf("ERROR: %v", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if !st.identity.Owner {
		user, err := d.pgUser(ctx, st.identity)
		if err != nil {
			return fmt.Errorf("ERROR: %v", err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+pgx.Identifier{user}.Sanitize()); err != nil {
			return fmt.Errorf("ERROR: %v", err)
		}
	}
	f := st.fault
	for i, sql := range st.sqls {
		sub := st.subs[i]
		st.set(func() { sub.status = "STARTED" })
		if f != nil && f.FailAt == i+1 {
			msg := f.Error
			if msg == "" {
				msg = "ERROR: injected failure"
			}
			st.set(func() { sub.status, sub.errText = "FAILED", msg })
			if f.Abort {
				return errAborted
			}
			return errors.New(msg)
		}
		rows, res, err := d.exec(ctx, tx, st, sql)
		if err != nil {
			msg := redshiftError(err)
			st.set(func() { sub.status, sub.errText = "FAILED", msg })
			return errors.New(msg)
		}
		st.set(func() { sub.status, sub.rows, sub.result = "FINISHED", rows, res })
	}
	if f != nil && f.Hold {
		f.heldOnce.Do(func() { close(f.held) })
		select {
		case <-f.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return errors.New(redshiftError(err))
	}
	return nil
}

// redshiftError words a PostgreSQL error as Redshift would: a serialization
// failure is Redshift's error 1023.
func redshiftError(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == "40001" {
			return "ERROR: 1023 DETAIL: Serializable isolation violation on table: " + pgErr.Message
		}
		if pgErr.Code == "22012" {
			return "ERROR: divide by zero"
		}
		return "ERROR: " + pgErr.Message
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "ERROR:") {
		msg = "ERROR: " + msg
	}
	return msg
}

// exec runs one statement of a transaction and returns the rows it
// affected and, for a query, its result.
func (d *Double) exec(ctx context.Context, tx pgx.Tx, st *statement, sql string) (int64, *result, error) {
	params := st.params
	if isCopy(sql) {
		c, err := parseCopy(sql)
		if err != nil {
			return 0, nil, err
		}
		if f := st.fault; f != nil && f.CopyDelay > 0 {
			f.copyOnce.Do(func() { close(f.copying) })
			select {
			case <-time.After(f.CopyDelay):
			case <-ctx.Done():
				return 0, nil, ctx.Err()
			}
		}
		n, err := d.runCopy(ctx, tx, c)
		return n, nil, err
	}
	pgSQL, args, err := translate(sql, params)
	if err != nil {
		return 0, nil, err
	}
	pgSQL = d.rewriteRoles(pgSQL)
	rows, err := tx.Query(ctx, pgSQL, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	var res *result
	if len(fields) > 0 {
		res = &result{}
		for _, f := range fields {
			res.columns = append(res.columns, column{Name: f.Name, TypeName: typeName(f.DataTypeOID)})
		}
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return 0, nil, err
		}
		rec := make([]map[string]any, len(vals))
		for i, v := range vals {
			rec[i] = field(v)
		}
		res.records = append(res.records, rec)
	}
	if err := rows.Err(); err != nil {
		return 0, nil, err
	}
	return rows.CommandTag().RowsAffected(), res, nil
}

func typeName(oid uint32) string {
	switch oid {
	case 20:
		return "int8"
	case 23:
		return "int4"
	case 21:
		return "int2"
	case 16:
		return "bool"
	case 1114:
		return "timestamp"
	case 1184:
		return "timestamptz"
	case 3802:
		return "super"
	case 701:
		return "float8"
	case 1700:
		return "numeric"
	}
	return "varchar"
}

// field encodes a value as the Data API's Field union.
func field(v any) map[string]any {
	switch x := v.(type) {
	case nil:
		return map[string]any{"isNull": true}
	case int64:
		return map[string]any{"longValue": x}
	case int32:
		return map[string]any{"longValue": int64(x)}
	case int16:
		return map[string]any{"longValue": int64(x)}
	case bool:
		return map[string]any{"booleanValue": x}
	case float64:
		return map[string]any{"doubleValue": x}
	case time.Time:
		return map[string]any{"stringValue": x.UTC().Format("2006-01-02 15:04:05.999999")}
	case string:
		return map[string]any{"stringValue": x}
	case []byte:
		return map[string]any{"stringValue": string(x)}
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return map[string]any{"stringValue": fmt.Sprint(x)}
		}
		return map[string]any{"stringValue": string(b)}
	}
}

type idRequest struct {
	ID        string `json:"Id"`
	NextToken string
}

func (d *Double) lookup(body []byte) (*statement, int, error) {
	var req idRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, 0, validation("malformed request: %v", err)
	}
	id, subNo := req.ID, 0
	if base, n, ok := strings.Cut(req.ID, ":"); ok {
		if _, err := fmt.Sscanf(n, "%d", &subNo); err != nil || subNo < 1 {
			return nil, 0, validation("invalid id %q", req.ID)
		}
		id = base
	}
	d.mu.Lock()
	st, ok := d.statements[id]
	d.mu.Unlock()
	if !ok {
		return nil, 0, &apiError{http.StatusBadRequest, "ResourceNotFoundException", "Query does not exist."}
	}
	if subNo > len(st.subs) {
		return nil, 0, &apiError{http.StatusBadRequest, "ResourceNotFoundException", "Query does not exist."}
	}
	return st, subNo, nil
}

func (d *Double) describe(ctx context.Context, body []byte) (any, error) {
	st, _, err := d.lookup(body)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.describes[st.id]++
	d.mu.Unlock()
	if f := st.fault; f != nil && f.HideOutcome {
		// Answer only once the transaction has ended, so that a client
		// polling a hidden outcome is sure to poll after the commit.
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	status, errText := st.status, st.errText
	if st.fault != nil && st.fault.HideOutcome && status != "SUBMITTED" {
		select {
		case <-st.fault.reveal:
		default:
			status, errText = "STARTED", ""
		}
	}
	out := map[string]any{
		"Id": st.id, "Status": status, "CreatedAt": epoch(st.created), "UpdatedAt": epoch(st.updated),
		"Database": st.target.Database, "QueryString": strings.Join(st.sqls, ";\n"),
	}
	if st.target.Workgroup != "" {
		out["WorkgroupName"] = st.target.Workgroup
	} else {
		out["ClusterIdentifier"] = st.target.Cluster
	}
	if errText != "" {
		out["Error"] = errText
	}
	hidden := status != st.status
	if st.batch {
		subs := make([]map[string]any, 0, len(st.subs))
		for i, sub := range st.subs {
			s := map[string]any{"Id": fmt.Sprintf("%s:%d", st.id, i+1), "Status": sub.status, "QueryString": st.sqls[i],
				"HasResultSet": sub.result != nil, "ResultRows": sub.rows}
			if hidden {
				s["Status"] = "STARTED"
			}
			if sub.errText != "" && !hidden {
				s["Error"] = sub.errText
			}
			subs = append(subs, s)
		}
		out["SubStatements"] = subs
		out["HasResultSet"] = false
	} else {
		out["HasResultSet"] = st.subs[0].result != nil
		out["ResultRows"] = st.subs[0].rows
	}
	return out, nil
}

func (d *Double) result(body []byte) (any, error) {
	st, subNo, err := d.lookup(body)
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.status != "FINISHED" {
		return nil, &apiError{http.StatusBadRequest, "ResourceNotFoundException", "Query does not have result. Please check query status with DescribeStatement."}
	}
	if subNo == 0 {
		if st.batch {
			return nil, validation("a batch's results are read per statement (id:N)")
		}
		subNo = 1
	}
	res := st.subs[subNo-1].result
	if res == nil {
		return nil, &apiError{http.StatusBadRequest, "ResourceNotFoundException", "Query does not have result."}
	}
	records := res.records
	if records == nil {
		records = [][]map[string]any{}
	}
	return map[string]any{"Records": records, "ColumnMetadata": res.columns, "TotalNumRows": len(res.records)}, nil
}

func (d *Double) cancel(body []byte) (any, error) {
	st, _, err := d.lookup(body)
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	running := st.status == "SUBMITTED" || st.status == "PICKED" || st.status == "STARTED"
	cancel := st.cancel
	st.mu.Unlock()
	if !running {
		return nil, validation("Could not cancel a query that is already in %s state", st.status)
	}
	cancel()
	return map[string]any{"Status": true}, nil
}
