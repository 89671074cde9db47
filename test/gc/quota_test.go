package gc

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// sessionQuota is the ResourceQuota resource that counts sessions, as docs/security.md names it.
const sessionQuota corev1.ResourceName = "count/" + locksv1alpha1.LockSessionsResource + ".locks.kubelock.io"

// A ResourceQuota bounds how many sessions lock users keep in a namespace: the
// apiserver refuses the create beyond it, naming the quota.
func TestSessionQuota(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	ns := newNamespace(ctx, t, cs)
	_, err := cs.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelock"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{sessionQuota: resource.MustParse("2")}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Until the resource quota controller has counted, the apiserver refuses every session create.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		q, err := cs.CoreV1().ResourceQuotas(ns).Get(ctx, "kubelock", metav1.GetOptions{})
		_, counted := q.Status.Used[sessionQuota]
		return counted, err
	})
	if err != nil {
		t.Fatalf("the resource quota controller never counted %s: %v", sessionQuota, err)
	}

	cfg, err := env.UserConfig(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	alice, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	create := func() (*locksv1alpha1.LockSession, error) {
		s := &locksv1alpha1.LockSession{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "alice-"},
			Spec:       locksv1alpha1.LockSessionSpec{User: "alice", Identity: "alice-laptop"},
		}
		return s, alice.Create(ctx, s)
	}
	first, err := create()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := create(); err != nil {
		t.Fatal(err)
	}
	_, err = create()
	const want = `exceeded quota: kubelock, requested: count/locksessions.locks.kubelock.io=1, used: count/locksessions.locks.kubelock.io=2, limited: count/locksessions.locks.kubelock.io=2`
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("third session: want 403 %q, got %v", want, err)
	}
	t.Logf("third session: %v", err)

	// Closing a session frees its place once the quota controller recounts.
	if err := alice.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, err := create()
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("no session after closing one: %v", err)
	}
}
