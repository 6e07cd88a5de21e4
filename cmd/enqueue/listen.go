package main

import (
	"strings"

	"github.com/fleet/ingest/internal/cli"
)

// cannotListen reports a listener that could not be bound, the address of
// --flag (its address taken, by a second serve on one host say, or not
// one of this host's), as the cannot_listen outcome line on stdout and an
// error in the log, and returns exit code 9 (cli.ExitListen).
func cannotListen(e *cli.Env, flag string, err error) error {
	coded := cli.CannotListen(flag, err)
	field := strings.ReplaceAll(flag, "-", "_")
	printJSON(e.Stdout, map[string]string{"outcome": "cannot_listen", "field": field, "error": coded.Err.Error()})
	e.Logger.Error(coded.Err.Error(), "field", field)
	return coded
}
