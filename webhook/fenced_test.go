package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
)

// locksReader is a client.Reader of the locks it holds, recording the names read.
type locksReader struct {
	client.Reader
	locks map[string]*locksv1alpha1.DistributedLock
	read  []string
}

func (r *locksReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.read = append(r.read, key.Name)
	l, ok := r.locks[key.Name]
	if !ok {
		return apierrors.NewNotFound(locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource(), key.Name)
	}
	into, ok := obj.(*locksv1alpha1.DistributedLock)
	if !ok {
		return fmt.Errorf("locksReader reads locks, not %T", obj)
	}
	l.DeepCopyInto(into)
	return nil
}

// The handler reads only what can be a lock's name, and a denied stale token
// makes a series only for a lock that exists, dropped once it is gone.
func TestFencedHandlerReadsAndCountsOnlyLocks(t *testing.T) {
	v := testValidator(t, nil, corev1.AddToScheme)
	const ns = "fenced-handler"
	db := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}}
	db.Status.FencingToken = 12
	r := &locksReader{locks: map[string]*locksv1alpha1.DistributedLock{"db": db}}
	v.reader = r
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.Hot)

	create := func(lock string) string {
		t.Helper()
		raw, err := json.Marshal(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cm",
			Labels:      map[string]string{locksv1alpha1.FencedLabel: "true"},
			Annotations: map[string]string{locksv1alpha1.FencedByAnnotation: lock, locksv1alpha1.FencingTokenAnnotation: "7"}}})
		if err != nil {
			t.Fatal(err)
		}
		resp := v.Fenced().Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Namespace: ns, UserInfo: authenticationv1.UserInfo{Username: "mallory"},
			Object: runtime.RawExtension{Raw: raw},
		}})
		if resp.Allowed {
			t.Fatalf("fenced by %.20q with a stale token: allowed", lock)
		}
		return resp.Result.Message
	}
	// series are the stale-token series of ns, by lock.
	series := func() map[string]float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				if f.GetName() == "kubelock_webhook_stale_token_rejections_total" && l["namespace"] == ns {
					out[l["lock"]] = m.GetCounter().GetValue()
				}
			}
		}
		return out
	}

	for _, lock := range []string{strings.Repeat("x", 100<<10), "../db", "DB"} {
		if msg := create(lock); !strings.Contains(msg, "[kubelock:fenced-by]") {
			t.Fatalf("fenced by %.20q: %q, want a fenced-by denial", lock, msg)
		}
	}
	if len(r.read) != 0 {
		t.Fatalf("read %d names that no lock can have", len(r.read))
	}
	for _, lock := range []string{"ghost", "db", "db"} {
		if msg := create(lock); !strings.Contains(msg, "[kubelock:stale-token]") {
			t.Fatalf("fenced by %s: %q, want a stale-token denial", lock, msg)
		}
	}
	if diff := cmp.Diff(map[string]float64{"db": 2}, series()); diff != "" {
		t.Fatalf("stale-token series (-want +got):\n%s", diff)
	}
	delete(r.locks, "db")
	create("db")
	if got := series(); len(got) != 0 {
		t.Fatalf("series after the lock is gone: %v", got)
	}
}
