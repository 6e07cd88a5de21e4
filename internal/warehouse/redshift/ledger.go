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

// Ledger implements warehouse.LedgerReader: one statement reads the
// slice's stamp and the ledger rows of the batch it is stamped with, so
// both come from one snapshot.
func (w *dataAPI) Ledger(ctx context.Context, tenantID, sourceScope string) (warehouse.Stamp, []warehouse.LedgerObject, bool, error) {
	v, err := sliceValues(warehouse.Slice{TenantID: tenantID, SourceScope: sourceScope})
	if err != nil {
		return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load ledger: %w", err)
	}
	rows, err := w.query(ctx, "fleet-ledger", render(readLedger, v))
	if err != nil {
		return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load ledger: %w", err)
	}
	var (
		st      warehouse.Stamp
		objects []warehouse.LedgerObject
	)
	for i, r := range rows {
		if len(r) != 12 {
			return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load ledger: %d columns", len(r))
		}
		var errs [12]error
		cur := warehouse.Stamp{}
		cur.BatchID, errs[0] = fieldInt(r[0])
		cur.Generation, errs[1] = fieldInt(r[1])
		cur.RecordCount, errs[2] = fieldInt(r[2])
		errs[3] = requiredTime(r[3], &cur.CommittedAt)
		cur.PublishedAt, errs[4] = fieldTime(r[4])
		cur.BadRecords, errs[5] = fieldInt(r[5])
		if i == 0 {
			st = cur
		}
		o := warehouse.LedgerObject{BatchID: cur.BatchID, TenantID: tenantID, SourceScope: sourceScope}
		if l := r[6:]; !isNull(l[0]) {
			o.ObjectKey, errs[6] = fieldString(l[0])
			o.ETag, errs[7] = fieldString(l[1])
			o.SizeBytes, errs[8] = fieldInt(l[2])
			o.RecordCount, errs[9] = fieldInt(l[3])
			errs[10] = requiredTime(l[4], &o.LastModified)
			o.MarkerModified, errs[11] = fieldTime(l[5])
		}
		if err := errors.Join(errs[:]...); err != nil {
			return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load ledger: %w", err)
		}
		if o.ObjectKey != "" {
			objects = append(objects, o)
		}
	}
	return st, objects, len(rows) > 0, nil
}

// LoadErrors implements warehouse.ErrorsReader: one statement reads the
// slice's stamp and the load errors of the batch it is stamped with, so
// both come from one snapshot.
func (w *dataAPI) LoadErrors(ctx context.Context, tenantID, sourceScope string) (warehouse.Stamp, []warehouse.LoadError, bool, error) {
	v, err := sliceValues(warehouse.Slice{TenantID: tenantID, SourceScope: sourceScope})
	if err != nil {
		return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load errors: %w", err)
	}
	rows, err := w.query(ctx, "fleet-load-errors", render(readLoadErrors, v))
	if err != nil {
		return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load errors: %w", err)
	}
	var (
		st   warehouse.Stamp
		list []warehouse.LoadError
	)
	for i, r := range rows {
		if len(r) != 12 {
			return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load errors: %d columns", len(r))
		}
		var errs [12]error
		cur := warehouse.Stamp{}
		cur.BatchID, errs[0] = fieldInt(r[0])
		cur.Generation, errs[1] = fieldInt(r[1])
		cur.RecordCount, errs[2] = fieldInt(r[2])
		errs[3] = requiredTime(r[3], &cur.CommittedAt)
		cur.PublishedAt, errs[4] = fieldTime(r[4])
		cur.BadRecords, errs[5] = fieldInt(r[5])
		if i == 0 {
			st = cur
		}
		if !isNull(r[6]) {
			e := warehouse.LoadError{BatchID: cur.BatchID, TenantID: tenantID, SourceScope: sourceScope}
			var column int64
			e.Ordinal, errs[6] = fieldInt(r[6])
			e.ObjectKey, errs[7] = fieldString(r[7])
			e.Line, errs[8] = fieldInt(r[8])
			column, errs[9] = fieldInt(r[9])
			e.Reason, errs[10] = fieldString(r[10])
			e.Excerpt, errs[11] = fieldString(r[11])
			e.Column = int(column)
			list = append(list, e)
		}
		if err := errors.Join(errs[:]...); err != nil {
			return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load errors: %w", err)
		}
	}
	return st, list, len(rows) > 0, nil
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
