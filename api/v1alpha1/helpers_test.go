package v1alpha1_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/kubelock/kubelock/api/v1alpha1"
)

const admin = "admin"

// micro is now at the precision a MicroTime survives a round trip with.
func micro() metav1.MicroTime { return metav1.NewMicroTime(time.Now().Truncate(time.Microsecond)) }

// newLock is a lock with every spec field set and a fresh random name in ns.
func newLock() *locksv1.DistributedLock {
	return &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "lock-" + utilrand.String(8), Namespace: ns},
		Spec: locksv1.DistributedLockSpec{
			Type:                    locksv1.Mutex,
			LeaseDurationSeconds:    30,
			MaxLeaseDurationSeconds: 300,
			MaxWaiters:              ptr.To[int32](4),
			HandoffTimeoutSeconds:   10,
			MaxWaitersPerUser:       ptr.To[int32](2),
			MaxWaitSeconds:          600,
		},
	}
}

func holder(user string, n int) locksv1.LockHolder {
	now := micro()
	return locksv1.LockHolder{
		Identity:             fmt.Sprintf("worker-%d", n),
		User:                 user,
		LeaseID:              fmt.Sprintf("lease-%016x", n),
		RequestID:            fmt.Sprintf("req-%d", n),
		LeaseDurationSeconds: 30,
		AcquireTime:          now,
		RenewTime:            &now,
	}
}

func waiter(user string, n int) locksv1.Waiter {
	now := micro()
	return locksv1.Waiter{
		Identity:    fmt.Sprintf("waiter-%d", n),
		User:        user,
		RequestID:   fmt.Sprintf("req-%d", n),
		EnqueueTime: now,
		Deadline:    metav1.NewMicroTime(now.Add(time.Minute)),
		Mode:        locksv1.Exclusive,
	}
}

// queueOf is a mutate that queues n waiters of carol.
func queueOf(n int) func(*locksv1.DistributedLock) {
	return func(l *locksv1.DistributedLock) {
		for i := range n {
			l.Status.AppendWaiter(waiter("carol", 10+i))
		}
	}
}

// readers is a mutate that adds n readers of carol on slots 0..n-1.
func readers(n int) func(*locksv1.DistributedLock) {
	return func(l *locksv1.DistributedLock) {
		token, err := locksv1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		for i := range n {
			l.AcquireShared(holder("carol", 10+i), int32(i), token)
		}
	}
}

// acquire makes h the holder of l with the token the design prescribes
// (resourceVersion + 1) and writes it through c.
func acquire(ctx context.Context, c client.Client, l *locksv1.DistributedLock, h locksv1.LockHolder) {
	token, err := locksv1.NextFencingToken(l.ResourceVersion)
	Expect(err).NotTo(HaveOccurred())
	l.Acquire(h, token)
	Expect(c.Status().Update(ctx, l)).To(Succeed())
}

// release ends l's holding as endedBy and writes it through c.
func release(ctx context.Context, c client.Client, l *locksv1.DistributedLock, endedBy string) {
	l.EndHolding(locksv1.EndReasonReleased, endedBy, micro())
	Expect(c.Status().Update(ctx, l)).To(Succeed())
}

// stored is the apiserver's JSON for the lock name, byte for byte; a lock that
// does not exist yields the NotFound error.
func stored(ctx context.Context, name string) (string, error) {
	cfg := rest.CopyConfig(env.Config)
	cfg.GroupVersion = &locksv1.GroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return "", err
	}
	body, err := rc.Get().Namespace(ns).Resource("distributedlocks").Name(name).DoRaw(ctx)
	return string(body), err
}

// userClient is a client authenticated as name with the lock-user role.
func userClient(ctx context.Context, name string) client.Client {
	cfg, err := env.UserConfig(ctx, name)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// long is a string of n letters.
func long(n int) string { return strings.Repeat("x", n) }

// toUnstructured is l as the JSON object the client would send.
func toUnstructured(l *locksv1.DistributedLock) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(l)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(locksv1.GroupVersion.WithKind("DistributedLock"))
	return u, nil
}

// causes are the individual failures a 422 Invalid reports.
func causes(err error) []string {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return nil
	}
	var out []string
	for _, c := range status.Status().Details.Causes {
		// The apiserver adds this note whenever the schema (types, bounds, enums)
		// already failed and it therefore skipped the CEL rules; it is no rule's message.
		if strings.Contains(c.Message, "some validation rules were not checked") {
			continue
		}
		out = append(out, c.Field+": "+c.Message)
	}
	return out
}
