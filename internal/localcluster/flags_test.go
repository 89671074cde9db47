package localcluster

import (
	"slices"
	"testing"
)

func TestWithFlags(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		defaults, extra, want []string
	}{
		{"extra added after", []string{"--a=1"}, []string{"--b=2"}, []string{"--a=1", "--b=2"}},
		{"extra replaces a default of its name", []string{"--a=1", "--b=2"}, []string{"--a=3"}, []string{"--b=2", "--a=3"}},
		{"a repeated extra is kept", []string{"--c=*"}, []string{"--c=x", "--c=y"}, []string{"--c=x", "--c=y"}},
		{"a flag without a value", []string{"--a"}, []string{"--a=false"}, []string{"--a=false"}},
		{"no extra", []string{"--a=1"}, nil, []string{"--a=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := withFlags(tc.defaults, tc.extra); !slices.Equal(got, tc.want) {
				t.Errorf("withFlags(%q, %q) = %q, want %q", tc.defaults, tc.extra, got, tc.want)
			}
		})
	}
}
