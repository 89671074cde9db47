//go:build !faults

package operator

import "k8s.io/utils/clock"

// testingClock is the fault-injection suite's shifted wall clock; only the
// binaries that suite builds (tag faults) carry it, so a product build has no
// environment variable that moves the controller's clock.
func testingClock() clock.PassiveClock { return nil }
