package cli

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:secret@h:5432/db?sslmode=disable":     "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"postgres://u@h/db":                                 "postgres://u@h/db",
		"postgres://u@h/db?password=secret&sslmode=disable": "postgres://u@h/db?password=xxxxx&sslmode=disable",
		"host=h user=u password=secret":                     "(unparsable connection string)",
	} {
		require.Equal(t, want, Redact(in))
	}
}

func TestConnectErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	_, err := Connect(context.Background(), "postgres://u:s3cr3tpw@127.0.0.1:1/db", PoolerNone, 2*time.Second, nil)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cr3tpw")
	_, err = Connect(context.Background(), "postgres://u:s3cr3tpw@127.0.0.1:notaport/db", PoolerNone, time.Second, nil)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cr3tpw")
	_, err = Connect(context.Background(), "", PoolerNone, time.Second, nil)
	require.ErrorIs(t, err, ErrNoDatabaseURL)
}
