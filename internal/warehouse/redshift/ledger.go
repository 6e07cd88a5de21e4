package redshift

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/redshiftdata/types"

	"github.com/fleet/ingest/internal/warehouse"
)

var (
	_ warehouse.LedgerReader = (*Warehouse)(nil)
	_ warehouse.LedgerReader = (*Stamps)(nil)
	_ warehouse.ErrorsReader = (*Warehouse)(nil)
	_ warehouse.ErrorsReader = (*Stamps)(nil)
)

// stampRows runs tmpl, a statement reading the slice's stamp (its first
// seven columns: batch, generation, records, committed, published, bad
// records, batch uid) beside the rows of another table for the batch it is stamped
// with (want columns in all), so both come from one snapshot. It returns
// the stamp and whether there is a slice, calling row with each row's
// stamp and its remaining columns; what names the reading in errors.
func (w *dataAPI) stampRows(ctx context.Context, name, tmpl, what, tenantID, sourceScope string, want int, row func(st warehouse.Stamp, rest []types.Field) error) (warehouse.Stamp, bool, error) {
	v, err := sliceValues(warehouse.Slice{TenantID: tenantID, SourceScope: sourceScope})
	if err != nil {
		return warehouse.Stamp{}, false, fmt.Errorf("reading %s: %w", what, err)
	}
	rows, err := w.query(ctx, name, render(tmpl, v))
	if err != nil {
		return warehouse.Stamp{}, false, fmt.Errorf("reading %s: %w", what, err)
	}
	var st warehouse.Stamp
	for i, r := range rows {
		if len(r) != want {
			return warehouse.Stamp{}, false, fmt.Errorf("reading %s: %d columns", what, len(r))
		}
		var errs [7]error
		cur := warehouse.Stamp{}
		cur.BatchID, errs[0] = fieldInt(r[0])
		cur.Generation, errs[1] = fieldInt(r[1])
		cur.RecordCount, errs[2] = fieldInt(r[2])
		errs[3] = requiredTime(r[3], &cur.CommittedAt)
		cur.PublishedAt, errs[4] = fieldTime(r[4])
		cur.BadRecords, errs[5] = fieldInt(r[5])
		cur.BatchUID, errs[6] = fieldString(r[6])
		if i == 0 {
			st = cur
		}
		err := errors.Join(errs[:]...)
		if err == nil {
			err = row(cur, r[7:])
		}
		if err != nil {
			return warehouse.Stamp{}, false, fmt.Errorf("reading %s: %w", what, err)
		}
	}
	return st, len(rows) > 0, nil
}

// Ledger implements warehouse.LedgerReader: one statement reads the
// slice's stamp and the ledger rows of the batch it is stamped with, so
// both come from one snapshot.
func (w *dataAPI) Ledger(ctx context.Context, tenantID, sourceScope string) (warehouse.Stamp, []warehouse.LedgerObject, bool, error) {
	var objects []warehouse.LedgerObject
	st, found, err := w.stampRows(ctx, "fleet-ledger", readLedger, "the load ledger", tenantID, sourceScope, 13, func(cur warehouse.Stamp, l []types.Field) error {
		if isNull(l[0]) {
			return nil // a stamp without ledger rows
		}
		var errs [6]error
		o := warehouse.LedgerObject{BatchID: cur.BatchID, BatchUID: cur.BatchUID, TenantID: tenantID, SourceScope: sourceScope}
		o.ObjectKey, errs[0] = fieldString(l[0])
		o.ETag, errs[1] = fieldString(l[1])
		o.SizeBytes, errs[2] = fieldInt(l[2])
		o.RecordCount, errs[3] = fieldInt(l[3])
		errs[4] = requiredTime(l[4], &o.LastModified)
		o.MarkerModified, errs[5] = fieldTime(l[5])
		if err := errors.Join(errs[:]...); err != nil {
			return err
		}
		objects = append(objects, o)
		return nil
	})
	if err != nil {
		return warehouse.Stamp{}, nil, false, err
	}
	return st, objects, found, nil
}

// LoadErrors implements warehouse.ErrorsReader: one statement reads the
// slice's stamp and the load errors of the batch it is stamped with, so
// both come from one snapshot.
func (w *dataAPI) LoadErrors(ctx context.Context, tenantID, sourceScope string) (warehouse.Stamp, []warehouse.LoadError, bool, error) {
	var list []warehouse.LoadError
	st, found, err := w.stampRows(ctx, "fleet-load-errors", readLoadErrors, "the load errors", tenantID, sourceScope, 13, func(cur warehouse.Stamp, r []types.Field) error {
		if isNull(r[0]) {
			return nil // a stamp without load errors
		}
		var (
			errs   [6]error
			column int64
		)
		e := warehouse.LoadError{BatchID: cur.BatchID, BatchUID: cur.BatchUID, TenantID: tenantID, SourceScope: sourceScope}
		e.Ordinal, errs[0] = fieldInt(r[0])
		e.ObjectKey, errs[1] = fieldString(r[1])
		e.Line, errs[2] = fieldInt(r[2])
		column, errs[3] = fieldInt(r[3])
		e.Reason, errs[4] = fieldString(r[4])
		e.Excerpt, errs[5] = fieldString(r[5])
		if err := errors.Join(errs[:]...); err != nil {
			return err
		}
		e.Column = int(column)
		list = append(list, e)
		return nil
	})
	if err != nil {
		return warehouse.Stamp{}, nil, false, err
	}
	return st, list, found, nil
}

// isNull reports whether f is NULL.
func isNull(f types.Field) bool {
	_, null := f.(*types.FieldMemberIsNull)
	return null
}

// requiredTime reads a TIMESTAMP that may not be NULL into t.
func requiredTime(f types.Field, t *time.Time) error {
	at, err := fieldTime(f)
	switch {
	case err != nil:
		return err
	case at == nil:
		return errors.New("unexpected NULL time")
	}
	*t = *at
	return nil
}

// fieldString reads a VARCHAR.
func fieldString(f types.Field) (string, error) {
	switch v := f.(type) {
	case *types.FieldMemberStringValue:
		return v.Value, nil
	case *types.FieldMemberIsNull:
		return "", errors.New("unexpected NULL")
	}
	return "", fmt.Errorf("unexpected field %T", f)
}
