//go:build !linux

package cli

// becomeSubreaper is a no-op where there is no child subreaper.
func becomeSubreaper() {}
