package batch

// PageQuery exposes pageQuery to the package's external tests (EXPLAIN).
func PageQuery(f PageFilter) (string, []any) {
	q, args, _ := pageQuery(f)
	return q, args
}
