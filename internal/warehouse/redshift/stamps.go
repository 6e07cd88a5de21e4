package redshift

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"

	"github.com/fleet/ingest/internal/warehouse"
)

// Stamps reads slice stamps and the load ledger only: what enqueue resume
// needs to prove a failed publication's slice is still its batch's, and
// what enqueue status --objects lists. It needs only the warehouse's
// target (ValidateTarget), not the staging settings.
type Stamps struct {
	dataAPI
}

var _ warehouse.StampReader = (*Stamps)(nil)

// OpenStamps returns a stamp reader with a Data API client from the
// standard AWS configuration chain (see Open).
func OpenStamps(ctx context.Context, cfg Config) (*Stamps, error) {
	if err := cfg.ValidateTarget(); err != nil {
		return nil, err
	}
	awsCfg, err := loadAWS(ctx)
	if err != nil {
		return nil, err
	}
	return NewStamps(cfg, redshiftdata.NewFromConfig(awsCfg))
}

// NewStamps returns a stamp reader on the given client.
func NewStamps(cfg Config, data *redshiftdata.Client) (*Stamps, error) {
	if err := cfg.ValidateTarget(); err != nil {
		return nil, err
	}
	return &Stamps{dataAPI{cfg: cfg.withDefaults(), data: data}}, nil
}
