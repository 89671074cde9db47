package controllers

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// FuzzDecide builds a stored lock of any type (holders, shared holders,
// waiters, records, written by anyone: names that cannot exist, sessions of
// other users, pods that are gone), a history of its versions as the
// controller observed them, and the sessions and pods its entries name
// (missing, terminating, foreign, lapsed, or unreadable), then runs what a
// reconcile runs (observe, liveness, decide, and the writes of act until
// nothing is left to do) on an injected clock, and holds every decision to
// the invariants: no holding ends before its lease and grace on the
// controller's clock unless its session or pod is known to be gone, nothing
// unknown ends anything, no holder is added, no token lowered, the queue
// keeps its order, and nothing overdue is left undone.
func FuzzDecide(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x01\x01\x02\x00\x03\x01\x01\x02\x05\x00\x03\x04\x02\x01\x00\x02\x06\x01\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &fuzzSource{b: data}
		w := s.world()
		r := reconcilerOf(w)
		h := s.history()
		sessionSeen := s.observeSessions(r, w, h.now)
		o := h.observation()
		live, failed := r.liveness(quiet(), h.last(), h.now)
		if bad := w.invalidReads(); len(bad) > 0 {
			t.Fatalf("read %v, which no object can be\nlock %s", bad, dump(h.last()))
		}
		if failed != slices.ContainsFunc(w.reads, func(k types.NamespacedName) bool { return w.fail[k] }) {
			t.Fatalf("liveness() failed = %v, but the failing reads were %v of %v", failed, w.fail, w.reads)
		}
		truth := truthOf(w, sessionSeen, h.now)
		for range len(h.last().Status.Holdings()) + len(h.last().Status.Waiters) + 2 {
			lock := h.last()
			d := decide(lock, o, live, h.now, testTiming)
			if msg := h.violation(d, truth); msg != "" {
				t.Fatalf("%s\ndecision %+v\nlock %s", msg, d, dump(lock))
			}
			if d.delete || !d.acts() {
				if msg := h.leftUndone(d, truth); !d.delete && msg != "" {
					t.Fatalf("%s\ndecision %+v\nlock %s", msg, d, dump(lock))
				}
				return
			}
			next := desiredStatus(lock, d, "controller", h.now)
			if msg := writeViolation(lock, next, d, h.now); msg != "" {
				t.Fatalf("%s\ndecision %+v\nbefore %s\nafter %s", msg, d, dump(lock), dump(next))
			}
			// act observes its own write, at the same instant.
			h.add(next, h.now)
			o, _ = observe(&o, next, h.now)
		}
		t.Fatalf("acting on its own writes did not end\nlock %s", dump(h.last()))
	})
}

// fuzzSource turns fuzz bytes into choices; once the bytes run out every
// choice is 0, so short inputs still build whole objects.
type fuzzSource struct {
	b []byte
	// ids numbers the entries built, so that their IDs are distinct.
	ids int
}

// id is a fresh ID.
func (s *fuzzSource) id() int {
	s.ids++
	return s.ids
}

func (s *fuzzSource) next() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

func (s *fuzzSource) intn(n int) int { return int(s.next()) % n }

func choose[T any](s *fuzzSource, xs ...T) T { return xs[s.intn(len(xs))] }

// str is up to 15 bytes of the input as a string: any name at all.
func (s *fuzzSource) str() string {
	n := s.intn(16)
	var b strings.Builder
	for range n {
		b.WriteByte(s.next())
	}
	return b.String()
}

// The names the fuzzed entries choose from: most can name an object, some
// cannot, and str makes up others.
const (
	uidP0 = "6f3c9a1e-2b4d-4e8f-9a0b-1c2d3e4f5a6b"
	uidP1 = "0d9e8f7a-6b5c-4d3e-8f1a-2b3c4d5e6f7a"
	uidP2 = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"
)

var (
	fuzzUsers        = []string{owner, owner, "system:serviceaccount:shop:other", "system:serviceaccount:kube-system:worker", "alice", badSAUser, extraSAUser}
	fuzzSessionNames = []string{"s1", "s2", "gone", "flaky", pathName, "Bad_Name", "s1/x", ".."}
	fuzzPodNames     = []string{"p0", "p1", "no-such-pod", pathName, "P0", slashName, "..", "p0.x"}
	fuzzPodUIDs      = []string{uidP0, uidP1, uidP2, notAUUID, upperUUID, "uid-" + uidP0}
)

func (s *fuzzSource) sessionName() string {
	switch s.intn(6) {
	case 0, 1:
		return ""
	case 2:
		return s.str()
	}
	return choose(s, fuzzSessionNames...)
}

// pod is a pod reference: none, one of the pool's, or made up.
func (s *fuzzSource) pod() (name, uid string) {
	switch s.intn(6) {
	case 0, 1:
		return "", ""
	case 2:
		return s.str(), choose(s, fuzzPodUIDs...)
	case 3:
		return choose(s, fuzzPodNames...), ""
	}
	return choose(s, fuzzPodNames...), choose(s, fuzzPodUIDs...)
}

// world builds the sessions and pods in namespaces shop and kube-system,
// some of whose reads fail.
func (s *fuzzSource) world() *world {
	w := &world{sessions: map[types.NamespacedName]*locksv1alpha1.LockSession{}, pods: map[types.NamespacedName]types.UID{},
		fail: map[types.NamespacedName]bool{}}
	for _, name := range []string{"s1", "s2", "flaky"} {
		key := types.NamespacedName{Namespace: "shop", Name: name}
		w.fail[key] = s.intn(4) == 0 || name == "flaky" && s.intn(4) != 0
		if s.intn(4) == 0 {
			continue
		}
		sess := &locksv1alpha1.LockSession{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: name, UID: types.UID("session-uid-" + name)},
			Spec: locksv1alpha1.LockSessionSpec{User: choose(s, fuzzUsers...), Identity: "client",
				TTLSeconds: choose[int32](s, 5, 10, 300, 3600)},
		}
		sess.Spec.PodName, sess.Spec.PodUID = s.pod()
		if s.intn(5) == 0 {
			sess.DeletionTimestamp = ptr.To(metav1.NewTime(clientTime))
		}
		if s.intn(2) == 0 {
			sess.Status.RenewTime = ptr.To(metav1.NewMicroTime(clientTime.Add(time.Duration(s.next()) * time.Second)))
		}
		w.sessions[key] = sess
	}
	for _, ns := range []string{"shop", "kube-system"} {
		for _, name := range []string{"p0", "p1"} {
			key := types.NamespacedName{Namespace: ns, Name: name}
			w.fail[key] = s.intn(5) == 0
			if s.intn(3) != 0 {
				w.pods[key] = types.UID(choose(s, uidP0, uidP1, uidP2))
			}
		}
	}
	return w
}

// observeSessions has r observe some of w's sessions before now, as the
// session controller would have, and returns when it first saw each one's
// current renewal (now for those it had not seen: liveness sees them now).
func (s *fuzzSource) observeSessions(r *Reconciler, w *world, now time.Time) map[types.NamespacedName]time.Time {
	seen := map[types.NamespacedName]time.Time{}
	for key, sess := range w.sessions {
		seen[key] = now
		if s.intn(2) == 0 {
			at := t0.Add(min(now.Sub(t0), time.Duration(s.next())*time.Second))
			r.sessions.observe(sess, at)
			seen[key] = at
		}
	}
	return seen
}

// fuzzHistory is the versions of one lock the controller observed, each at
// a time of its clock, and the time it decides at.
type fuzzHistory struct {
	versions []*locksv1alpha1.DistributedLock
	at       []time.Time
	now      time.Time
	// malformed: the lock breaks what the CRD and admission keep (two
	// entries with one leaseID or requestID); only the write checks hold.
	malformed bool
}

func (h *fuzzHistory) last() *locksv1alpha1.DistributedLock { return h.versions[len(h.versions)-1] }

func (h *fuzzHistory) add(l *locksv1alpha1.DistributedLock, at time.Time) {
	h.versions = append(h.versions, l)
	h.at = append(h.at, at)
}

func (h *fuzzHistory) observation() observation {
	var o *observation
	for i, l := range h.versions {
		next, _ := observe(o, l, h.at[i])
		o = &next
	}
	return *o
}

// history builds a lock and up to three later versions of it, as clients
// change it, observed at growing times.
func (s *fuzzSource) history() *fuzzHistory {
	h := &fuzzHistory{}
	l, malformed := s.lock()
	h.malformed = malformed
	at := t0
	h.add(l, at)
	for range s.intn(4) {
		next := l.DeepCopy()
		rv, _ := strconv.Atoi(next.ResourceVersion)
		next.ResourceVersion = strconv.Itoa(rv + 1)
		s.change(next)
		at = at.Add(choose(s, 0, time.Second, 5*time.Second, 30*time.Second, 5*time.Minute))
		h.add(next, at)
		l = next
	}
	h.now = at.Add(choose(s, 0, time.Microsecond, time.Second, 2*time.Second, 6*time.Second, 12*time.Second, 32*time.Second, time.Hour))
	return h
}

// lock builds a stored lock of any type; malformed when it has two entries
// with one leaseID or requestID.
func (s *fuzzSource) lock() (*locksv1alpha1.DistributedLock, bool) {
	l := newLock()
	l.Spec.Type = choose(s, locksv1alpha1.Mutex, locksv1alpha1.RWMutex, locksv1alpha1.Semaphore, "")
	if l.Spec.Type == locksv1alpha1.Semaphore {
		l.Spec.Permits = ptr.To(int32(1 + s.intn(12)))
	}
	l.Spec.HandoffTimeoutSeconds = choose[int32](s, 10, 1, 0)
	l.Spec.MaxLeaseDurationSeconds = choose[int32](s, 300, 30, 3600)
	if s.intn(4) == 0 {
		autoCreated(l)
	}
	for i := range s.intn(9) {
		l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, locksv1alpha1.FinishedHolding{
			RequestID: fmt.Sprintf("old-%d", i), LeaseID: fmt.Sprintf("old-lease-%d", i), FencingToken: int64(10 + i),
			Identity: "old", EndTime: metav1.NewMicroTime(clientTime), EndReason: locksv1alpha1.EndReasonReleased, EndedBy: "old",
		})
		l.Status.FencingToken, l.Status.Transitions = int64(10+i), int64(i+1)
	}
	if l.Supports(locksv1alpha1.Exclusive) && s.intn(3) == 0 {
		l.Acquire(s.holder(), l.Status.FencingToken+1)
	} else if l.Supports(locksv1alpha1.Shared) {
		// Up to a dozen: more than one write records.
		for range s.intn(13) {
			slot, ok := l.FreeSlot()
			if !ok {
				break
			}
			l.AcquireShared(s.holder(), slot, l.Status.FencingToken+1)
		}
	}
	for range s.intn(6) {
		l.Status.AppendWaiter(s.waiter(l))
	}
	malformed := false
	if s.intn(16) == 0 {
		malformed = true
		switch hs := l.Status.SharedHolders; {
		case len(hs) > 1:
			hs[1].LeaseID = hs[0].LeaseID
		case len(l.Status.Waiters) > 1:
			l.Status.Waiters[1].RequestID = l.Status.Waiters[0].RequestID
		}
	}
	return l, malformed
}

func (s *fuzzSource) holder() locksv1alpha1.LockHolder {
	id := strconv.Itoa(s.id())
	renew := metav1.NewMicroTime(clientTime.Add(time.Duration(s.next()) * time.Second))
	h := locksv1alpha1.LockHolder{Identity: "worker-" + id, User: choose(s, fuzzUsers...), LeaseID: "lease-" + id, RequestID: "req-" + id,
		LeaseDurationSeconds: choose[int32](s, 30, 1, 5, 300), AcquireTime: metav1.NewMicroTime(clientTime), RenewTime: &renew}
	h.Session = s.sessionName()
	h.PodName, h.PodUID = s.pod()
	return h
}

func (s *fuzzSource) waiter(l *locksv1alpha1.DistributedLock) locksv1alpha1.Waiter {
	w := locksv1alpha1.Waiter{Identity: "w", User: choose(s, fuzzUsers...), RequestID: "q-" + strconv.Itoa(s.id()),
		EnqueueTime: metav1.NewMicroTime(clientTime)}
	w.Deadline = metav1.NewMicroTime(clientTime.Add(choose(s, time.Hour, 2*time.Second, 30*time.Second, 0, -time.Second)))
	w.Mode = choose(s, l.DefaultMode(), locksv1alpha1.Exclusive, locksv1alpha1.Shared, "")
	w.Session = s.sessionName()
	w.PodName, w.PodUID = s.pod()
	return w
}

// change makes one change a client, or a force-releasing administrator,
// makes to l: a renewal, a release, a force-release, a new or a leaving
// waiter, the head's acquisition, or a write that is none of those.
func (s *fuzzSource) change(l *locksv1alpha1.DistributedLock) {
	st := &l.Status
	hs := st.Holdings()
	now := metav1.NewMicroTime(clientTime)
	switch s.intn(7) {
	case 0:
		if len(hs) > 0 {
			h := hs[s.intn(len(hs))]
			renewed := metav1.NewMicroTime(h.RenewTime.Add(time.Second))
			h.RenewTime = &renewed
		}
	case 1, 2:
		if len(hs) > 0 {
			h := hs[s.intn(len(hs))]
			reason := choose(s, locksv1alpha1.EndReasonReleased, locksv1alpha1.EndReasonForceReleased)
			if h.Slot == nil {
				l.EndHolding(reason, "someone", now)
			} else {
				l.EndShared(h.LeaseID, reason, "someone", now)
			}
		}
	case 3:
		st.AppendWaiter(s.waiter(l))
	case 4:
		if len(st.Waiters) > 0 {
			st.RemoveWaiter(st.Waiters[s.intn(len(st.Waiters))].RequestID)
		}
	case 5:
		if len(st.Waiters) == 0 || !l.Admits(headMode(l, &st.Waiters[0])) {
			return
		}
		head := st.Waiters[0]
		h := s.holder()
		h.RequestID, h.User, h.Session, h.PodName, h.PodUID = head.RequestID, head.User, head.Session, head.PodName, head.PodUID
		token, _ := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		if headMode(l, &head) == locksv1alpha1.Exclusive {
			l.Acquire(h, token)
		} else {
			slot, _ := l.FreeSlot()
			l.AcquireShared(h, slot, token)
		}
	}
}

// fuzzTruth is what the world says about the sessions and pods entries name.
type fuzzTruth struct {
	w           *world
	sessionSeen map[types.NamespacedName]time.Time
	now         time.Time
}

func truthOf(w *world, sessionSeen map[types.NamespacedName]time.Time, now time.Time) fuzzTruth {
	return fuzzTruth{w: w, sessionSeen: sessionSeen, now: now}
}

// sessionEnds says whether an entry of user (and podUID) in session name of
// a lock with maxLease (0 for a waiter) may end for its session, and with
// which reason: never while its read fails.
func (f fuzzTruth) sessionEnds(name, user, podUID string, maxLease int32) (locksv1alpha1.EndReason, bool) {
	if !validSessionName(name) {
		return locksv1alpha1.EndReasonSessionClosed, true
	}
	key := types.NamespacedName{Namespace: "shop", Name: name}
	if f.w.fail[key] {
		return "", false
	}
	sess := f.w.sessions[key]
	if locksv1alpha1.SessionRefusal(key.Namespace, name, sess, user, podUID, maxLease) != "" {
		return locksv1alpha1.EndReasonSessionClosed, true
	}
	if !f.now.Before(f.sessionSeen[key].Add(seconds(sess.TTL()) + testTiming.grace)) {
		return locksv1alpha1.EndReasonSessionExpired, true
	}
	return "", true
}

// podGone reports whether the pod of an entry is known to be gone.
func (f fuzzTruth) podGone(user, podName, podUID string) bool {
	ref, b := podOf(user, podName, podUID)
	if b != podBound || f.w.fail[ref.key] {
		return false
	}
	uid, ok := f.w.pods[ref.key]
	return !ok || string(uid) != ref.uid
}

// runStart is when the run of versions ending with the last began in which
// keep held; zero when the last version fails it.
func (h *fuzzHistory) runStart(keep func(l *locksv1alpha1.DistributedLock) bool) time.Time {
	var since time.Time
	for i, l := range h.versions {
		switch {
		case !keep(l):
			since = time.Time{}
		case since.IsZero():
			since = h.at[i]
		}
	}
	return since
}

// renewSeen is when the controller first saw holding leaseID's latest renewal.
func (h *fuzzHistory) renewSeen(leaseID string) time.Time {
	mark := renewMark(holdingOf(h.last(), leaseID).LockHolder)
	return h.runStart(func(l *locksv1alpha1.DistributedLock) bool {
		hd := holdingOf(l, leaseID)
		return hd.LockHolder != nil && renewMark(hd.LockHolder) == mark
	})
}

func holdingOf(l *locksv1alpha1.DistributedLock, leaseID string) locksv1alpha1.Holding {
	for _, hd := range l.Status.Holdings() {
		if hd.LeaseID == leaseID {
			return hd
		}
	}
	return locksv1alpha1.Holding{}
}

// waitDue is when the controller may drop waiter w for its deadline.
func (h *fuzzHistory) waitDue(w locksv1alpha1.Waiter) time.Time {
	seen := h.runStart(func(l *locksv1alpha1.DistributedLock) bool { return l.Status.WaiterIndex(w.RequestID) >= 0 })
	return seen.Add(max(0, w.Deadline.Sub(w.EnqueueTime.Time)))
}

// handoffDue is when the controller may drop the head for not claiming the
// lock, zero when the lock does not admit it.
func (h *fuzzHistory) handoffDue() time.Time {
	l := h.last()
	if len(l.Status.Waiters) == 0 {
		return time.Time{}
	}
	head := l.Status.Waiters[0].RequestID
	since := h.runStart(func(v *locksv1alpha1.DistributedLock) bool {
		return len(v.Status.Waiters) > 0 && v.Status.Waiters[0].RequestID == head && v.Admits(headMode(v, &v.Status.Waiters[0]))
	})
	if since.IsZero() {
		return since
	}
	return since.Add(seconds(handoffTimeout(l)))
}

// violation is what decision d about the last version must not do: end a
// holding or drop a waiter the truth does not allow.
func (h *fuzzHistory) violation(d decision, f fuzzTruth) string {
	l := h.last()
	if len(d.ends) > locksv1alpha1.MaxRecentAcquisitions {
		return fmt.Sprintf("%d holdings end in one write", len(d.ends))
	}
	if d.requeueAfter < 0 || d.acts() && d.requeueAfter != 0 {
		return fmt.Sprintf("requeue after %s", d.requeueAfter)
	}
	if h.malformed {
		return ""
	}
	for i, e := range d.ends {
		if slices.ContainsFunc(d.ends[:i], func(o ending) bool { return o.leaseID == e.leaseID }) {
			return "holding " + e.leaseID + " ends twice"
		}
		hd := holdingOf(l, e.leaseID)
		if hd.LockHolder == nil {
			return "ends " + e.leaseID + ", which is no holding"
		}
		if (e.slot == nil) != (hd.Slot == nil) || e.token != hd.Token {
			return "ends " + e.leaseID + " as another holding"
		}
		if msg := h.endViolation(hd, e, f); msg != "" {
			return "holding " + e.leaseID + ": " + msg
		}
	}
	for i, dr := range d.drop {
		if slices.ContainsFunc(d.drop[:i], func(o droppedWaiter) bool { return o.requestID == dr.requestID }) {
			return "waiter " + dr.requestID + " dropped twice"
		}
		at := l.Status.WaiterIndex(dr.requestID)
		if at < 0 {
			return "drops " + dr.requestID + ", which is no waiter"
		}
		if msg := h.dropViolation(l.Status.Waiters[at], at, dr.reason, f); msg != "" {
			return "waiter " + dr.requestID + ": " + msg
		}
	}
	if d.delete && (l.IsHeld() || len(l.Status.Waiters) > 0 || !isAutoCreated(l)) {
		return "deletes a lock in use, or not auto-created"
	}
	return ""
}

// endViolation: holding hd may end as e only when its session or pod is
// known to be gone (session holdings have no lease), or at its lease and
// grace after the controller first saw its latest renewal (I5).
func (h *fuzzHistory) endViolation(hd locksv1alpha1.Holding, e ending, f fuzzTruth) string {
	if hd.Session != "" {
		want, known := f.sessionEnds(hd.Session, hd.User, hd.PodUID, h.last().MaxLease())
		if !known || want != e.reason {
			return fmt.Sprintf("ended %s (%s); its session says %q (known: %v)", e.reason, e.why, want, known)
		}
		return ""
	}
	if e.reason != locksv1alpha1.EndReasonExpired {
		return fmt.Sprintf("ended %s without a session", e.reason)
	}
	if e.due.IsZero() {
		if !f.podGone(hd.User, hd.PodName, hd.PodUID) {
			return "ended for its pod (" + e.why + "), which is not known to be gone"
		}
		return ""
	}
	lease := h.renewSeen(hd.LeaseID).Add(seconds(hd.LeaseDurationSeconds) + testTiming.grace)
	if !e.due.Equal(lease) || f.now.Before(lease) {
		return fmt.Sprintf("expired at %s, due %s; its lease and grace run to %s", f.now, e.due, lease)
	}
	return ""
}

// dropViolation: waiter w, at position at, may leave only with its session
// or pod known to be gone, a pod reference no pod can have, at its deadline,
// or, at the head, at the hand-off timeout.
func (h *fuzzHistory) dropViolation(w locksv1alpha1.Waiter, at int, reason dropReason, f fuzzTruth) string {
	switch reason {
	case dropWaitTimeout:
		if due := h.waitDue(w); f.now.Before(due) {
			return fmt.Sprintf("dropped at %s before its deadline %s", f.now, due)
		}
	case dropHandoffTimeout:
		if due := h.handoffDue(); at != 0 || due.IsZero() || f.now.Before(due) {
			return fmt.Sprintf("dropped for the hand-off at position %d, at %s, hand-off due %s", at, f.now, due)
		}
	case dropSessionExpired, dropSessionClosed:
		want, known := f.sessionEnds(w.Session, w.User, w.PodUID, 0)
		if w.Session == "" || !known || dropReason(want) != reason {
			return fmt.Sprintf("dropped %s; its session %q says %q (known: %v)", reason, w.Session, want, known)
		}
	case dropPodDeleted:
		if _, b := podOf(w.User, w.PodName, w.PodUID); w.Session != "" || b != boundToNoPod && !f.podGone(w.User, w.PodName, w.PodUID) {
			return "dropped PodDeleted; its pod is not known to be gone"
		}
	default:
		return "dropped " + string(reason)
	}
	return ""
}

// leftUndone is what a decision that no longer acts must not leave: a
// holding or waiter whose session or pod is known to be gone, a lapsed
// lease, a passed deadline or hand-off; and it comes back by the next.
func (h *fuzzHistory) leftUndone(d decision, f fuzzTruth) string {
	if h.malformed {
		return ""
	}
	l := h.last()
	var next time.Time
	due := func(at time.Time) bool {
		if at.After(f.now) && (next.IsZero() || at.Before(next)) {
			next = at
		}
		return !at.After(f.now)
	}
	for _, hd := range l.Status.Holdings() {
		if hd.Session != "" {
			if reason, known := f.sessionEnds(hd.Session, hd.User, hd.PodUID, l.MaxLease()); known && reason != "" {
				return "holding " + hd.LeaseID + " left in its session, which says " + string(reason)
			}
			continue
		}
		if f.podGone(hd.User, hd.PodName, hd.PodUID) {
			return "holding " + hd.LeaseID + " left while its pod is gone"
		}
		if due(h.renewSeen(hd.LeaseID).Add(seconds(hd.LeaseDurationSeconds) + testTiming.grace)) {
			return "holding " + hd.LeaseID + " left past its lease"
		}
	}
	for _, w := range l.Status.Waiters {
		if w.Session != "" {
			if reason, known := f.sessionEnds(w.Session, w.User, w.PodUID, 0); known && reason != "" {
				return "waiter " + w.RequestID + " left in its session, which says " + string(reason)
			}
		} else if _, b := podOf(w.User, w.PodName, w.PodUID); b == boundToNoPod || f.podGone(w.User, w.PodName, w.PodUID) {
			return "waiter " + w.RequestID + " left while its pod is gone or cannot exist"
		}
		if due(h.waitDue(w)) {
			return "waiter " + w.RequestID + " left past its deadline"
		}
	}
	if at := h.handoffDue(); !at.IsZero() && due(at) {
		return "head left past the hand-off timeout"
	}
	if !next.IsZero() && (d.requeueAfter <= 0 || d.requeueAfter > next.Sub(f.now)) {
		return fmt.Sprintf("requeued after %s; the next deadline is in %s", d.requeueAfter, next.Sub(f.now))
	}
	return ""
}

// writeViolation is what the write of decision d at now, before → after,
// must not do: add or change a holding, end one it did not decide, lower the
// token, reorder the queue, or record what did not end.
func writeViolation(before, after *locksv1alpha1.DistributedLock, d decision, now time.Time) string {
	b, a := &before.Status, &after.Status
	if equality.Semantic.DeepEqual(b, a) {
		return "an acting decision changes nothing: the reconcile would stop there"
	}
	if a.FencingToken != b.FencingToken || a.Transitions != b.Transitions {
		return fmt.Sprintf("token %d → %d, transitions %d → %d", b.FencingToken, a.FencingToken, b.Transitions, a.Transitions)
	}
	// The holdings after are those before less the ended ones, each ending
	// the holding it names (leaseID, slot and token), recorded in order.
	left := b.Holdings()
	records := slices.Clone(b.RecentAcquisitions)
	for _, e := range d.ends {
		i := slices.IndexFunc(left, func(hd locksv1alpha1.Holding) bool {
			return hd.LeaseID == e.leaseID && ptr.Equal(hd.Slot, e.slot) && hd.Token == e.token
		})
		if i < 0 {
			return fmt.Sprintf("ending %s slot %v token %d names no holding", e.leaseID, ptr.Deref(e.slot, -1), e.token)
		}
		hd := left[i]
		records = append(records, locksv1alpha1.FinishedHolding{RequestID: hd.RequestID, LeaseID: hd.LeaseID, FencingToken: hd.Token,
			Identity: hd.Identity, EndTime: metav1.NewMicroTime(now), EndReason: e.reason, EndedBy: "controller", Slot: hd.Slot})
		left = slices.Delete(left, i, i+1)
	}
	got := a.Holdings()
	if len(got) != len(left) {
		return fmt.Sprintf("%d holdings left, want %d", len(got), len(left))
	}
	for i, hd := range got {
		want := left[i]
		if !equality.Semantic.DeepEqual(*want.LockHolder, *hd.LockHolder) || want.Token != hd.Token || !ptr.Equal(want.Slot, hd.Slot) {
			return fmt.Sprintf("holding %d is %s slot %v, want %s slot %v, unchanged", i, hd.LeaseID, ptr.Deref(hd.Slot, -1), want.LeaseID, ptr.Deref(want.Slot, -1))
		}
	}
	if want := records[max(0, len(records)-locksv1alpha1.MaxRecentAcquisitions):]; !equality.Semantic.DeepEqual(want, a.RecentAcquisitions) {
		return "recentAcquisitions is not the old one and the ended holdings, the last 8:\n" + cmp.Diff(want, a.RecentAcquisitions)
	}
	// The queue is the old one less the dropped (each the first of its
	// requestID, as RemoveWaiter does), in order.
	kept := slices.Clone(b.Waiters)
	for _, dr := range d.drop {
		if i := slices.IndexFunc(kept, func(w locksv1alpha1.Waiter) bool { return w.RequestID == dr.requestID }); i >= 0 {
			kept = slices.Delete(kept, i, i+1)
		}
	}
	if !equality.Semantic.DeepEqual(kept, a.Waiters) && len(kept)+len(a.Waiters) > 0 {
		return "the queue is not the old one less the dropped, in order:\n" + cmp.Diff(kept, a.Waiters)
	}
	if int(a.HolderCount) != len(got) || int(a.WaiterCount) != len(a.Waiters) {
		return fmt.Sprintf("holderCount %d, waiterCount %d", a.HolderCount, a.WaiterCount)
	}
	return ""
}

func dump(l *locksv1alpha1.DistributedLock) string {
	return fmt.Sprintf("%s type %s permits %v, auto-created %v: %+v", l.ResourceVersion, l.Spec.Type, ptr.Deref(l.Spec.Permits, 0), isAutoCreated(l), l.Status)
}
