package migrations

import (
	"bufio"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

//go:embed warehouse/redshift/*.sql
var redshiftFiles embed.FS

// RedshiftMigration is one file of the Amazon Redshift warehouse schema
// (migrations/warehouse/redshift), split into its statements. The
// warehouse/redshift package applies each file in one Data API transaction.
type RedshiftMigration struct {
	Version    int64
	Name       string
	Statements []string
}

// RedshiftWarehouse returns the Redshift warehouse migrations in version
// order. Files are named NNNNN_name.sql; statements end with ";" at the end
// of a line, and lines starting with "--" are comments.
func RedshiftWarehouse() ([]RedshiftMigration, error) {
	names, err := fs.Glob(redshiftFiles, "warehouse/redshift/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]RedshiftMigration, 0, len(names))
	seen := map[int64]string{}
	for _, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		version, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("redshift migration %s: name must start with a positive version and '_'", base)
		}
		if prev, dup := seen[version]; dup {
			return nil, fmt.Errorf("redshift migrations %s and %s share version %d", prev, base, version)
		}
		seen[version] = base
		b, err := redshiftFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		stmts := splitStatements(string(b))
		if len(stmts) == 0 {
			return nil, fmt.Errorf("redshift migration %s holds no statement", base)
		}
		out = append(out, RedshiftMigration{Version: version, Name: base, Statements: stmts})
	}
	return out, nil
}

// splitStatements splits a migration file into statements: comment lines
// are dropped and a statement ends with a line ending in ";".
func splitStatements(src string) []string {
	var (
		stmts []string
		cur   strings.Builder
	)
	sc := bufio.NewScanner(strings.NewReader(src))
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		if cur.Len() > 0 {
			cur.WriteByte('\n')
		}
		cur.WriteString(line)
		if strings.HasSuffix(line, ";") {
			stmts = append(stmts, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		stmts = append(stmts, strings.TrimSpace(cur.String()))
	}
	return stmts
}
