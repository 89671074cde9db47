package lock

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestNameForKey(t *testing.T) {
	long := strings.Repeat("a", 64)
	cases := []struct {
		key     string
		want    string // exact name, or "" to only check the shape
		prefix  string
		wantErr string
	}{
		{key: "orders", want: "orders"},
		{key: "db.primary-1", want: "db.primary-1"},
		{key: "Orders/42", prefix: "orders-42-"},
		{key: "tenant a: invoices", prefix: "tenant-a-invoices-"},
		{key: "---", prefix: "key-"},
		{key: "日本", prefix: "key-"},
		{key: long, prefix: strings.Repeat("a", prefixLen) + "-"},
		{key: "", wantErr: "must not be empty"},
		{key: strings.Repeat("x", 1025), wantErr: "limit is 1024"},
	}
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			got, err := NameForKey(tc.key)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NameForKey(%q) error = %v, want one containing %q", tc.key, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NameForKey(%q): %v", tc.key, err)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("NameForKey(%q) = %q, want %q", tc.key, got, tc.want)
			}
			if !strings.HasPrefix(got, tc.prefix) {
				t.Errorf("NameForKey(%q) = %q, want prefix %q", tc.key, got, tc.prefix)
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 || len(got) > maxPlainName {
				t.Errorf("NameForKey(%q) = %q is not a short valid object name: %v", tc.key, got, errs)
			}
		})
	}
}

func TestNameForKeyKeepsDistinctKeysApart(t *testing.T) {
	a, _ := NameForKey("Orders/42")
	b, _ := NameForKey("orders 42")
	if a == b {
		t.Fatalf("distinct keys map to the same name %q", a)
	}
}
