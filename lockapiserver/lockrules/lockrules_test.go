package lockrules

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

const writer = "writer"

// busyLock is a lock as pkg/lock leaves a busy one: recentAcquisitions
// full, then held by writer.
func busyLock() *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "busy", Generation: 1, ResourceVersion: "500"}}
	t := metav1.NewMicroTime(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	for i := range locksv1alpha1.MaxRecentAcquisitions + 2 {
		l.Acquire(locksv1alpha1.LockHolder{Identity: "writer-0", User: writer, LeaseID: fmt.Sprintf("lease-%d", i), RequestID: fmt.Sprintf("request-%d", i),
			LeaseDurationSeconds: 30, AcquireTime: t, RenewTime: &t}, int64(100+i))
		if i <= locksv1alpha1.MaxRecentAcquisitions {
			l.EndHolding(locksv1alpha1.EndReasonReleased, writer, t)
		}
	}
	return l
}

// renewal is old with its holder's renewTime a second later.
func renewal(old *locksv1alpha1.DistributedLock) *locksv1alpha1.DistributedLock {
	l := old.DeepCopy()
	t := metav1.NewMicroTime(l.Status.Holder.RenewTime.Add(time.Second))
	l.Status.Holder.RenewTime = &t
	return l
}

// BenchmarkRenewal is what the rules cost a busy lock's renewal, the write
// the lock apiserver takes most.
func BenchmarkRenewal(b *testing.B) {
	c, err := New(authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
		return authorizer.DecisionDeny, "", nil
	}), []string{"controller"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := genericapirequest.WithUser(context.Background(), &user.DefaultInfo{Name: writer})
	old := busyLock()
	renewed := renewal(old)
	if err := c.LockStatusUpdate(ctx, renewed, old); err != nil {
		b.Fatalf("the renewal is denied: %v", err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = c.LockStatusUpdate(ctx, renewed, old)
	}
}
