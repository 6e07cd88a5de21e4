package redshift

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata/types"
	"github.com/aws/smithy-go"

	"github.com/fleet/ingest/internal/warehouse"
)

// Statement kinds, as recorded in the Journal (batch details).
const (
	kindLoadCopy = "redshift-load-copy"
	kindLoadSwap = "redshift-load-swap"
	kindPublish  = "redshift-publish"
)

var _ warehouse.StatementWatcher = (*Warehouse)(nil)

// follow continues what a previous delivery left running: when the journal
// records a statement of this warehouse, it is followed to its end before
// anything else is submitted. A statement recorded without its id (the
// delivery died between submitting and recording it) is submitted again
// with the recorded attempt's ClientToken, which returns the statement the
// Data API already runs, or starts it if the first submission never
// arrived; a publication is not repeated that way, since publishing is
// idempotent and the caller publishes anyway.
//
// It reports whether a statement was followed. When the statement is still
// running at the deadline (LoadTimeout for a load, QueryTimeout for a
// publication) it returns an error wrapping warehouse.ErrTransient: the
// delivery is retried and nothing new was submitted. A statement the Data
// API no longer knows (kept 24 hours, which bounds a query's run time)
// has ended.
func (w *Warehouse) follow(ctx context.Context, s warehouse.Slice, j warehouse.Journal) (bool, error) {
	if j == nil {
		return false, nil
	}
	p, ok := j.Pending()
	if !ok {
		return false, nil
	}
	timeout := w.cfg.LoadTimeout
	switch p.Kind {
	case kindLoadCopy, kindLoadSwap:
	case kindPublish:
		timeout = w.cfg.QueryTimeout
	default:
		return false, nil // not this warehouse's
	}
	ps := s
	ps.Generation = p.Generation
	log := w.cfg.Logger.With("batch_id", s.BatchID, "lease_generation", s.Generation, "statement_kind", p.Kind, "statement_generation", p.Generation, "statement_id", p.ID)
	if p.ID == "" {
		sqls, name, ok, err := w.rebuild(ps, p)
		if err != nil {
			return false, err
		}
		if ok {
			log.Info("a previous delivery's submission was recorded without its id: submitting it again with its client token")
			id, err := w.submitIdempotent(ctx, name, sqls, clientToken(p.Kind, s.Ref(), p.Generation, p.Attempt), timeout)
			if err != nil {
				return false, fmt.Errorf("%w: %w: repeating the submission of %s: %w", warehouse.ErrTransient, errOutcomeUnknown, name, err)
			}
			p.ID = id
			if err := j.Record(ctx, p); err != nil {
				return false, err
			}
			log = log.With("statement_id", id)
		}
	}
	if p.ID != "" {
		log.Info("following a statement a previous delivery submitted")
		d, err := w.await(ctx, p.ID, timeout, w.cfg.LoadPollInterval, w.cfg.LoadPollMax)
		var apiErr smithy.APIError
		switch {
		case err == nil:
			log.Info("the followed statement ended", "status", d.Status, "error", aws.ToString(d.Error))
		case errors.As(err, &apiErr) && apiErr.ErrorCode() == "ResourceNotFoundException":
			log.Info("the followed statement is no longer known to the Data API: it ended")
		case ctx.Err() != nil:
			return false, err
		default:
			return false, fmt.Errorf("a statement of batch %d submitted by generation %d may still commit: %w", s.BatchID, p.Generation, err)
		}
	}
	if p.Kind == kindLoadCopy {
		w.dropStagingTable(ctx, ps) // its delivery is gone; this one stages its own
	}
	if err := j.Record(ctx, warehouse.Statement{}); err != nil {
		return false, err
	}
	return true, nil
}

// rebuild returns the transaction a recorded submission sent, exactly, and
// its name; false for a publication.
func (w *Warehouse) rebuild(ps warehouse.Slice, p warehouse.Statement) ([]string, string, bool, error) {
	v, err := sliceValues(ps)
	if err != nil {
		return nil, "", false, err
	}
	switch p.Kind {
	case kindLoadCopy:
		recordsURL := ""
		if p.Records > 0 {
			recordsURL = w.manifestURL(ps)
		}
		return stageSQL(ps, recordsURL, w.ledgerManifestURL(ps), w.errorsManifestURL(ps), w.cfg.IAMRole), loadName("copy", ps), true, nil
	case kindLoadSwap:
		return swapSQL(ps, v, p.Records, p.Records > 0), loadName("swap", ps), true, nil
	}
	return nil, "", false, nil
}

func loadName(step string, s warehouse.Slice) string {
	return fmt.Sprintf("fleet-load-%s-%d-%d", step, s.BatchID, s.Generation)
}

// StatementEnded implements warehouse.StatementWatcher: a recorded
// statement has ended once DescribeStatement reports FINISHED, FAILED or
// ABORTED, or no longer knows it. One recorded without its id may have
// been submitted and is never known to have ended here.
func (w *Warehouse) StatementEnded(ctx context.Context, st warehouse.Statement) (bool, error) {
	if st.ID == "" {
		return false, nil
	}
	ctx, done := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer done()
	d, err := w.data.DescribeStatement(ctx, &redshiftdata.DescribeStatementInput{Id: aws.String(st.ID)})
	var apiErr smithy.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.ErrorCode() == "ResourceNotFoundException":
		return true, nil
	case err != nil:
		return false, fmt.Errorf("describing statement %s: %w", st.ID, err)
	}
	switch d.Status {
	case types.StatusStringFinished, types.StatusStringFailed, types.StatusStringAborted:
		return true, nil
	}
	return false, nil
}
