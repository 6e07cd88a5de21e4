//go:build race

package fleet_test

// raceEnabled: the race detector's shadow memory roughly doubles resident
// memory, so memory bounds are relaxed accordingly.
const raceEnabled = true
