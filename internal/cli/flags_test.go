package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNamesFlagMatchesWholeFlags(t *testing.T) {
	t.Parallel()
	require.True(t, NamesFlag("run with `--limit 50`", "limit"))
	require.True(t, NamesFlag("`enqueue list [--limit 50]`", "limit"))
	require.True(t, NamesFlag("--limit=5", "limit"))
	require.False(t, NamesFlag("`--limit-rate`", "limit"), "a longer flag does not name it")
	require.False(t, NamesFlag("`--rate-limit`", "limit"))
	require.False(t, NamesFlag("limit", "limit"))

	type grammar struct {
		Globals
		Sub struct {
			Shown  int `name:"shown" env:"SHOWN"`
			Secret int `name:"secret" hidden:""`
		} `cmd:""`
	}
	flags, err := Flags(&grammar{}, "x")
	require.NoError(t, err)
	byName := map[string]FlagDoc{}
	for _, f := range flags {
		byName[f.Name] = f
	}
	require.Equal(t, "sub", byName["shown"].Command)
	require.Equal(t, []string{"SHOWN"}, byName["shown"].Envs)
	require.NotContains(t, byName, "secret", "hidden flags are not documented")
	require.Contains(t, byName, "database-url")
}
