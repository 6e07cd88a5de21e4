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
		if len(r) != 11 {
			return warehouse.Stamp{}, nil, false, fmt.Errorf("reading the load ledger: %d columns", len(r))
		}
		var errs [11]error
		cur := warehouse.Stamp{}
		cur.BatchID, errs[0] = fieldInt(r[0])
		cur.Generation, errs[1] = fieldInt(r[1])
		cur.RecordCount, errs[2] = fieldInt(r[2])
		errs[3] = requiredTime(r[3], &cur.CommittedAt)
		cur.PublishedAt, errs[4] = fieldTime(r[4])
		if i == 0 {
			st = cur
		}
		o := warehouse.LedgerObject{BatchID: cur.BatchID, TenantID: tenantID, SourceScope: sourceScope}
		if _, null := r[5].(*types.FieldMemberIsNull); !null {
			o.ObjectKey, errs[5] = fieldString(r[5])
			o.ETag, errs[6] = fieldString(r[6])
			o.SizeBytes, errs[7] = fieldInt(r[7])
			o.RecordCount, errs[8] = fieldInt(r[8])
			errs[9] = requiredTime(r[9], &o.LastModified)
			o.MarkerModified, errs[10] = fieldTime(r[10])
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
