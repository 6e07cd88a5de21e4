package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// exitCodes reads the package's Exit* constants from its source, so that
// a code added without a README row fails TestREADMEDocumentsEveryExitCode
// without anyone listing it twice.
func exitCodes(t *testing.T) map[string]int {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	codes := map[string]int{}
	for _, entry := range entries {
		if name := entry.Name(); !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, entry.Name(), nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Exit") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					require.True(t, ok && lit.Kind == token.INT, "%s is an integer literal", name.Name)
					v, err := strconv.Atoi(lit.Value)
					require.NoError(t, err)
					codes[name.Name] = v
				}
			}
		}
	}
	return codes
}

// TestREADMEDocumentsEveryExitCode: the README's exit-code table has one
// row per exit code of the binaries (the Exit* constants), with its number
// and name, and no row for a code that does not exist.
func TestREADMEDocumentsEveryExitCode(t *testing.T) {
	t.Parallel()
	codes := exitCodes(t)
	require.Equal(t, ExitListen, codes["ExitListen"])
	require.GreaterOrEqual(t, len(codes), 10)

	raw, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	readme := string(raw)
	start := strings.Index(readme, "\n### Exit codes\n")
	require.NotEqual(t, -1, start, "README.md has an Exit codes section")
	section := readme[start+1:]
	if end := strings.Index(section[1:], "\n#"); end != -1 {
		section = section[:end+1]
	}
	row := regexp.MustCompile("(?m)^\\| ([0-9]+) \\| `(Exit[A-Za-z]+)` \\| (.+) \\|$")
	documented := map[string]int{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		v, _ := strconv.Atoi(m[1])
		require.NotContains(t, documented, m[2], "one row per code")
		require.NotEmpty(t, strings.TrimSpace(m[3]), "%s says what it means", m[2])
		documented[m[2]] = v
	}
	require.Equal(t, codes, documented, "the README's exit codes (number and name) are the binaries'")
}
