package lease

// The statements, for the tests of their plans.
var (
	RenewSQL = renewSQL
	CheckSQL = checkSQL
)
