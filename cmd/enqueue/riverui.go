package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"riverqueue.com/riverui"
)

// riverUIPrefix is where enqueue serve mounts the River UI.
const riverUIPrefix = "/riverui"

// riverUI returns the River UI (jobs, queues, their attempts and errors)
// for client's database, started until ctx ends, to be mounted at
// riverUIPrefix behind the listener's authentication.
func riverUI(ctx context.Context, client *river.Client[pgx.Tx], logger *slog.Logger) (http.Handler, error) {
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    logger,
		Prefix:    riverUIPrefix,
	})
	if err != nil {
		return nil, err
	}
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	return h, nil
}
