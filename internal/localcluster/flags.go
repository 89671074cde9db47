package localcluster

import "strings"

// withFlags is defaults with extra after them, each flag given as
// --name=value; a flag of extra replaces every default of the same name (a
// flag given several times in extra is passed several times).
func withFlags(defaults, extra []string) []string {
	given := map[string]bool{}
	for _, f := range extra {
		given[flagName(f)] = true
	}
	out := make([]string, 0, len(defaults)+len(extra))
	for _, f := range defaults {
		if !given[flagName(f)] {
			out = append(out, f)
		}
	}
	return append(out, extra...)
}

// flagName is the name of --name=value (or --name).
func flagName(flag string) string {
	name, _, _ := strings.Cut(strings.TrimLeft(flag, "-"), "=")
	return name
}
