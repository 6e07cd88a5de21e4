package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/warehouse"
)

func TestIsTransient(t *testing.T) {
	t.Parallel()
	transient := []error{
		&pgconn.PgError{Code: "40001"},
		&pgconn.PgError{Code: "40P01"},
		&pgconn.PgError{Code: "57P01"},
		&pgconn.PgError{Code: "08006"},
		&pgconn.PgError{Code: "53300"},
		&pgconn.PgError{Code: "25006"}, // read-only: a standby, or an old primary after a failover
		fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40001"}),
		&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED},
		fmt.Errorf("copy: %w", io.ErrUnexpectedEOF),
		syscall.ECONNRESET,
		context.DeadlineExceeded,
		fmt.Errorf("load: %w", warehouse.ErrTransient),
		&smithy.GenericAPIError{Code: "SlowDown", Message: "Please reduce your request rate."},
		&smithy.GenericAPIError{Code: "ThrottlingException", Message: "Rate exceeded"},
		&types.ActiveStatementsExceededException{Message: aws.String("too many")},
		&smithy.OperationError{ServiceID: "S3", OperationName: "GetObject", Err: &awshttp.ResponseError{
			ResponseError: &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 503}}, Err: errors.New("unavailable")}}},
	}
	for _, err := range transient {
		require.True(t, IsTransient(err), "%v", err)
	}
	terminal := []error{
		nil,
		errors.New("something odd"),
		&pgconn.PgError{Code: "P0001", Message: "raised by a trigger"},
		&pgconn.PgError{Code: "23505"},
		&pgconn.PgError{Code: "22P05"},
		&pgconn.PgError{Code: "42501"}, // permission denied
		fmt.Errorf("%w: bad row", folder.ErrMalformed),
		Fail(batch.PhaseFailedPreCommit, syscall.ECONNRESET),
		&os.PathError{Op: "stat", Path: "/x", Err: syscall.ENOENT},
		folder.ErrEmpty,
		&smithy.GenericAPIError{Code: "NoSuchBucket", Message: "The specified bucket does not exist"},
		&smithy.GenericAPIError{Code: "AccessDenied"},
		&types.ValidationException{Message: aws.String("bad sql")},
	}
	for _, err := range terminal {
		require.False(t, IsTransient(err), "%v", err)
	}
}
