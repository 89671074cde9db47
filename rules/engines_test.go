package rules

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/policytest"
)

// statusPolicy is config/policy's status policy as the apiserver compiles it.
var statusPolicy = sync.OnceValues(func() (*policytest.Policy, error) { return policytest.Load("") })

// expectPolicyAgrees runs one case of a rule table through the policy engine
// as well: it admits what the webhook admits, and otherwise denies with a
// message the webhook also gives (the first failing validation's). byCRD
// marks a case whose denial the policy leaves to the CRD's rules, which the
// apiserver evaluates first; the admission suite shows the CRD's message for
// both engines there.
func expectPolicyAgrees(t *testing.T, oldObj, newObj *locksv1alpha1.DistributedLock, a Actor, errs field.ErrorList, byCRD bool) {
	t.Helper()
	denied, webhookErrs := len(errs) > 0, ""
	if denied {
		webhookErrs = errs.ToAggregate().Error()
	}
	p, err := statusPolicy()
	if err != nil {
		t.Fatal(err)
	}
	msg, _, err := p.Judge(context.Background(), oldObj, newObj, policytest.Writer{Name: a.Username, Extra: a.Extra, ForceRelease: mayForce(a)})
	switch {
	case err != nil && byCRD && strings.Contains(err.Error(), policytest.EvalErrorPrefix):
		// Only a stored object the CRD allows reaches the policy.
	case err != nil:
		t.Fatalf("policy: %v", err)
	case byCRD:
		if msg != "" && !strings.Contains(webhookErrs, msg) {
			t.Fatalf("policy denied with %q, which the webhook does not say: %s", msg, webhookErrs)
		}
	case !denied && msg != "":
		t.Fatalf("the webhook admits, the policy denies: %s", msg)
	case denied && msg == "":
		t.Fatalf("the webhook denies (%s), the policy admits", webhookErrs)
	case denied && !strings.Contains(webhookErrs, msg):
		t.Fatalf("policy denied with %q, which the webhook does not say: %s", msg, webhookErrs)
	}
}

// FuzzEnginesAgree feeds the shared-mode generator's writes to both engines:
// the webhook's rules and the policy as the apiserver compiles it must admit
// and deny the same writes. Writes the CRD refuses before admission (two
// entries on one slot, a queue entry twice) are left out, and a policy that
// fails to evaluate denies (failurePolicy Fail).
func FuzzEnginesAgree(f *testing.F) {
	f.Add([]byte{})
	p, err := statusPolicy()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &bytesource{b: data}
		var oldObj *locksv1alpha1.DistributedLock
		newObj := (*locksv1alpha1.DistributedLock)(nil)
		var hint *Actor
		if s.intn(4) == 0 {
			oldObj = s.lock()
			newObj = oldObj.DeepCopy()
			hint = s.mutate(newObj)
		} else {
			oldObj = s.sharedLock()
			newObj = oldObj.DeepCopy()
			hint = s.mutateShared(newObj)
		}
		a := s.actor(hint)
		a.IsController = a.Username == ctrlr // the policy knows the controller by name only
		// Both engines see the objects as JSON (times to the microsecond).
		// A time Go cannot read back both deny as time-format, before decoding.
		var ok bool
		if oldObj, ok = viaJSON(oldObj); !ok {
			return
		}
		if newObj, ok = viaJSON(newObj); !ok {
			return
		}
		if refusedByCRD(oldObj) || refusedByCRD(newObj) {
			return
		}
		errs := ValidateStatusUpdate(oldObj, newObj, a)
		msg, _, err := p.Judge(context.Background(), oldObj, newObj, policytest.Writer{Name: a.Username, Extra: a.Extra, ForceRelease: mayForce(a)})
		policyDenies := msg != "" || (err != nil && strings.Contains(err.Error(), policytest.EvalErrorPrefix))
		if err != nil && !policyDenies {
			t.Fatal(err)
		}
		if policyDenies != (len(errs) > 0) {
			t.Fatalf("webhook: %v\npolicy: %q %v\nactor %+v\nold %s\nnew %s", errs.ToAggregate(), msg, err, a, dump(oldObj.Status), dump(newObj.Status))
		}
	})
}

// refusedByCRD: what the CRD's schema refuses before admission and the
// generator can produce: list-map keys twice (slots, requestIDs, condition
// types), MicroTimes off the pattern, a condition without lastTransitionTime
// (Go writes its zero time as null).
func refusedByCRD(l *locksv1alpha1.DistributedLock) bool {
	types := map[string]bool{}
	for _, c := range l.Status.Conditions {
		if c.LastTransitionTime.IsZero() || types[c.Type] {
			return true
		}
		types[c.Type] = true
	}
	for _, e := range validateTimes(&l.Status) {
		if !strings.HasPrefix(e.Field, conditionsPath.String()) {
			return true
		}
	}
	slots, reqs := map[int32]bool{}, map[string]bool{}
	for _, e := range l.Status.SharedHolders {
		if slots[e.Slot] {
			return true
		}
		slots[e.Slot] = true
	}
	for _, w := range l.Status.Waiters {
		if reqs[w.RequestID] {
			return true
		}
		reqs[w.RequestID] = true
	}
	return false
}

// viaJSON is l as an engine decodes it; false when Go cannot read it back.
func viaJSON(l *locksv1alpha1.DistributedLock) (*locksv1alpha1.DistributedLock, bool) {
	out := &locksv1alpha1.DistributedLock{}
	b, err := json.Marshal(l)
	return out, err == nil && json.Unmarshal(b, out) == nil
}
