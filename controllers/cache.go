package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	sigsjson "sigs.k8s.io/json"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// The controller keeps its own cache of locks, sessions and pods' metadata,
// whose scheme decodes a DistributedLock as a cachedLock: the typed object,
// decoded object by object. A typed informer decodes a whole LIST (or a watch
// stream) through the Go types at once, so a single object they cannot read
// — a time the CRD's date-time format admits but metav1.MicroTime does not
// parse — would stop the cache, and with it the expiry of every lock. An
// unstructured cache avoids that at about three times the memory (a map per
// JSON object: ~2.0 KB for a never-used lock, ~8.8 KB for one with a full
// history, against ~0.7 and ~3.1 KB typed; cache_test.go).

// cachedLock is a DistributedLock as the controller's cache holds it. One
// that does not decode keeps its metadata only, and why.
type cachedLock struct {
	locksv1alpha1.DistributedLock
	// undecodable is the decoding error; empty when the lock decoded.
	undecodable string
	// received is when the cache received this version, on the controller's
	// clock (newCache's transform); zero for an object that did not come
	// through the cache.
	received time.Time
}

// cachedLockList is the list type of cachedLock, for the informer's LIST.
type cachedLockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []cachedLock `json:"items"`
}

// UnmarshalJSON decodes a DistributedLock; one that does not decode keeps the
// type and object metadata the apiserver wrote, and the error.
func (c *cachedLock) UnmarshalJSON(data []byte) error {
	*c = cachedLock{}
	// As the apiserver's own JSON decoding: case-sensitive, integers kept.
	err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &c.DistributedLock)
	if err == nil {
		return nil
	}
	var meta struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
	}
	if merr := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &meta); merr != nil {
		return fmt.Errorf("%w (and its metadata: %w)", err, merr)
	}
	*c = cachedLock{DistributedLock: locksv1alpha1.DistributedLock{TypeMeta: meta.TypeMeta, ObjectMeta: meta.Metadata}, undecodable: err.Error()}
	return nil
}

func (c *cachedLock) DeepCopyObject() runtime.Object { return c.deepCopy() }

func (c *cachedLock) deepCopy() *cachedLock {
	out := &cachedLock{undecodable: c.undecodable, received: c.received}
	c.DeepCopyInto(&out.DistributedLock)
	return out
}

func (l *cachedLockList) DeepCopyObject() runtime.Object {
	out := &cachedLockList{TypeMeta: l.TypeMeta}
	l.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]cachedLock, len(l.Items))
		for i := range l.Items {
			out.Items[i] = *l.Items[i].deepCopy()
		}
	}
	return out
}

// cacheScheme is the built-in types, LockSession, and DistributedLock as cachedLock.
func cacheScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	gv := locksv1alpha1.GroupVersion
	s.AddKnownTypes(gv, &locksv1alpha1.LockSession{}, &locksv1alpha1.LockSessionList{})
	s.AddKnownTypeWithName(gv.WithKind(lockGVK.Kind), &cachedLock{})
	s.AddKnownTypeWithName(gv.WithKind(lockGVK.Kind+"List"), &cachedLockList{})
	metav1.AddToGroupVersion(s, gv)
	return s, nil
}

// lockGVK is the kind the controller watches.
var lockGVK = locksv1alpha1.GroupVersion.WithKind("DistributedLock")

// podMetadata is the metadata of a Pod, as the controller caches pods.
func podMetadata() *metav1.PartialObjectMetadata {
	p := &metav1.PartialObjectMetadata{}
	p.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	return p
}

// newCache returns a cache for the controller on mgr's connection, with
// opts' namespaces and selectors. Each lock is stamped with when it arrived
// on clk. Nothing it holds carries managedFields, and pods keep only what
// tells a deleted pod's holdings apart: every pod of the cluster is cached,
// however few hold locks.
func newCache(mgr ctrl.Manager, opts cache.Options, clk clock.PassiveClock) (cache.Cache, error) {
	s, err := cacheScheme()
	if err != nil {
		return nil, err
	}
	opts.Scheme, opts.Mapper, opts.HTTPClient = s, mgr.GetRESTMapper(), mgr.GetHTTPClient()
	strip := cache.TransformStripManagedFields()
	opts.DefaultTransform = func(in any) (any, error) {
		if l, ok := in.(*cachedLock); ok {
			l.received = clk.Now()
		}
		return strip(in)
	}
	if opts.ByObject == nil {
		opts.ByObject = map[client.Object]cache.ByObject{}
	}
	opts.ByObject[podMetadata()] = cache.ByObject{Transform: podIdentity}
	c, err := cache.New(mgr.GetConfig(), opts)
	if err != nil {
		return nil, fmt.Errorf("controllers: cache: %w", err)
	}
	return c, nil
}

// podIdentity keeps of a pod's metadata what podGone and locksOfPod read.
var podIdentity toolscache.TransformFunc = func(in any) (any, error) {
	p, ok := in.(*metav1.PartialObjectMetadata)
	if !ok {
		return in, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: p.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp,
	}}, nil
}

// enqueueLocks enqueues the lock of each event as
// handler.EnqueueRequestForObject does, at a priority by what the lock has to
// time: one with a holding or a waiter goes with the deadlines
// (deadlinePriority), ahead of idle locks, and of a new controller's initial
// list idle locks go behind everything else. So a new leader times held
// leases and queues first, and 100,000 idle locks, new or relisted, never
// delay an acquisition's first reconcile or an expiry.
type enqueueLocks struct {
	handler.TypedEnqueueRequestForObject[*cachedLock]
}

// lockPriority is the work-queue priority of an event about l.
func lockPriority(l *cachedLock, initialList bool) int {
	switch {
	case l.IsHeld() || len(l.Status.Waiters) > 0:
		return deadlinePriority
	case initialList:
		return handler.LowPriority
	}
	return 0
}

func (enqueueLocks) Create(_ context.Context, e event.TypedCreateEvent[*cachedLock], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	enqueueAt(q, e.Object, lockPriority(e.Object, e.IsInInitialList))
}

func (enqueueLocks) Update(_ context.Context, e event.TypedUpdateEvent[*cachedLock], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	p := lockPriority(e.ObjectNew, false)
	if e.ObjectOld.ResourceVersion == e.ObjectNew.ResourceVersion {
		p = handler.LowPriority // a resync: nothing changed
	}
	enqueueAt(q, e.ObjectNew, p)
}

// enqueueAt adds l's key at priority p when q is a priority queue.
func enqueueAt(q workqueue.TypedRateLimitingInterface[reconcile.Request], l *cachedLock, p int) {
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(l)}
	pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
	if !ok {
		q.Add(req)
		return
	}
	pq.AddWithOpts(priorityqueue.AddOpts{Priority: &p}, req)
}
