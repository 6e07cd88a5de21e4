package batch

// FencedUpdate is the fenced write's statement, for the test of its plan.
var FencedUpdate = fencedUpdate
