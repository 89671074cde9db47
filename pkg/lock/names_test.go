package lock

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
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

// TestKeyAnnotation: a lock is another key's only when its key annotation
// names a key of the same name, and is shown as that key only then; the
// annotation of a key of another name (a lock user's create of someone
// else's key first, red team) or one no key can have says nothing about the
// lock.
func TestKeyAnnotation(t *testing.T) {
	hashed, _ := NameForKey("Orders/42")
	cases := []struct {
		name, annotation, key string
		colliding             bool
		keyOf                 string
	}{
		{name: "orders", annotation: "orders", key: "orders", keyOf: "orders"},
		{name: "orders", key: "orders", keyOf: "orders"},
		{name: "orders", annotation: "payments", key: "orders", keyOf: "orders"},
		{name: "orders", annotation: strings.Repeat("k", 200<<10), key: "orders", keyOf: "orders"},
		{name: hashed, annotation: "Orders/42", key: "Orders/42", keyOf: "Orders/42"},
		{name: hashed, annotation: "orders 42", key: "Orders/42", keyOf: hashed},
		{name: hashed, annotation: "Orders/42", key: "a colliding key", colliding: true, keyOf: "Orders/42"},
	}
	for _, tc := range cases {
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: tc.name}}
		if tc.annotation != "" {
			l.Annotations = map[string]string{locksv1alpha1.KeyAnnotation: tc.annotation}
		}
		if k, got := collidingKey(l, tc.key); got != tc.colliding || got && k != tc.annotation {
			t.Errorf("collidingKey(%s with %.20q, %q) = %.20q, %v; want %v", tc.name, tc.annotation, tc.key, k, got, tc.colliding)
		}
		if got := KeyOf(l); got != tc.keyOf {
			t.Errorf("KeyOf(%s with %.20q) = %.20q, want %q", tc.name, tc.annotation, got, tc.keyOf)
		}
	}
}
