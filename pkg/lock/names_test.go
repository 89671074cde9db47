package lock

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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

// TestForeignKeyIsClipped: a lock's key annotation is written by whoever
// created the lock, up to the apiserver's 256 kB of annotations; the error
// that names it quotes at most maxKeyLen bytes of it.
func TestForeignKeyIsClipped(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	squat := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "orders",
		Annotations: map[string]string{locksv1alpha1.KeyAnnotation: strings.Repeat("k", 200<<10)}}}
	c, err := NewFromClient(fake.NewClientBuilder().WithScheme(scheme).WithObjects(squat).Build(), WithIdentity("me"), WithNamespace("default"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Get(context.Background(), "orders")
	if err == nil || !strings.Contains(err.Error(), "belongs to key") || len(err.Error()) > 2*maxKeyLen {
		t.Fatalf("Get of a lock of another key: %.200v (%d bytes), want a 'belongs to key' error under %d bytes", err, len(fmt.Sprint(err)), 2*maxKeyLen)
	}
}
