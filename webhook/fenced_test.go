package webhook

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

func TestValidateFencedWrite(t *testing.T) {
	obj := func(ann map[string]string) metav1.Object { return &metav1.ObjectMeta{Annotations: ann} }
	fenced := func(token string) metav1.Object {
		m := map[string]string{locksv1alpha1.FencedByAnnotation: "db"}
		if token != "" {
			m[locksv1alpha1.FencingTokenAnnotation] = token
		}
		return obj(m)
	}
	held := FencedLock{Exists: true, Token: 12, HolderUser: "alice"}
	alice, bob := Actor{Username: "alice"}, Actor{Username: "bob"}
	breakglass := Actor{Username: "root", CanForceRelease: true}
	const (
		create = admissionv1.Create
		update = admissionv1.Update
		del    = admissionv1.Delete
	)
	cases := []struct {
		name     string
		op       admissionv1.Operation
		old, new metav1.Object
		lock     FencedLock
		a        Actor
		rule     Rule
		want     string // "" = allowed
	}{
		{name: "not fenced", op: update, old: obj(nil), new: obj(nil), a: bob},
		{name: "create unfenced", op: create, new: obj(map[string]string{"x": "y"}), a: bob},
		{name: "holder creates with the current token", op: create, new: fenced("12"), lock: held, a: alice},
		{name: "holder's first token", op: update, old: fenced(""), new: fenced("12"), lock: held, a: alice},
		{name: "holder writes again", op: update, old: fenced("12"), new: fenced("12"), lock: held, a: alice},
		{name: "holder after an older token", op: update, old: fenced("10"), new: fenced("12"), lock: held, a: alice},
		{name: "holder deletes a stamped object", op: del, old: fenced("12"), lock: held, a: alice},
		{name: "holder removes the fence with its token", op: update, old: fenced("12"), new: obj(map[string]string{locksv1alpha1.FencingTokenAnnotation: "12"}), lock: held, a: alice},
		{name: "force-release user with the current token", op: update, old: fenced("12"), new: fenced("12"), lock: FencedLock{Exists: true, Token: 12}, a: breakglass},

		{name: "stale token below the object's highest", op: update, old: fenced("12"), new: fenced("10"), lock: held, a: alice, rule: RuleStaleToken, want: `stale fencing token 10 for lock "db": this object already accepted token 12`},
		{name: "token not current (a later holding began)", op: update, old: fenced("10"), new: fenced("10"), lock: held, a: alice, rule: RuleStaleToken, want: `fencing token 10 is not the current token of lock "db"`},
		{name: "missing token", op: update, old: fenced("12"), new: fenced(""), lock: held, a: alice, rule: RuleStaleToken, want: "must carry the holder's fencing token"},
		{name: "removing the fence needs a token", op: update, old: fenced("12"), new: obj(nil), lock: held, a: alice, rule: RuleStaleToken, want: "also removing the fence"},
		{name: "malformed token", op: update, old: fenced("12"), new: fenced("x12"), lock: held, a: alice, rule: RuleStaleToken, want: "not a positive integer"},
		{name: "forged token", op: update, old: fenced("12"), new: fenced("9223372036854775807"), lock: held, a: alice, rule: RuleStaleToken, want: `fencing token 9223372036854775807 was never issued by lock "db"`},
		{name: "lock gone", op: update, old: fenced("12"), new: fenced("13"), a: alice, rule: RuleStaleToken, want: "does not exist"},
		{name: "carried-over token from the holder's write", op: update, old: fenced("12"), new: fenced("12"), lock: held, a: bob, rule: RuleFencedWriter, want: `user "bob" does not hold lock "db"`},
		{name: "create by a non-holder with the current token", op: create, new: fenced("12"), lock: held, a: bob, rule: RuleFencedWriter, want: "does not hold"},
		{name: "create with a stale token", op: create, new: fenced("10"), lock: held, a: bob, rule: RuleStaleToken, want: "is not the current token"},
		{name: "lock free: nobody is the holder", op: update, old: fenced("12"), new: fenced("12"), lock: FencedLock{Exists: true, Token: 12}, a: alice, rule: RuleFencedWriter, want: `lock "db" is not held`},
		{name: "holder of another pod", op: update, old: fenced("12"), new: fenced("12"), lock: FencedLock{Exists: true, Token: 12, HolderUser: "alice", HolderPodUID: "p1"}, a: Actor{Username: "alice", Extra: map[string][]string{ExtraPodUID: {"p2"}}}, rule: RuleFencedWriter, want: "another pod"},
		{name: "delete by a non-holder", op: del, old: fenced("12"), lock: held, a: bob, rule: RuleFencedWriter, want: "does not hold"},
		{name: "delete of an object stamped by an earlier holding", op: del, old: fenced("10"), lock: held, a: alice, rule: RuleStaleToken, want: "the current holder writes its token into the object first"},
		{name: "delete of an unstamped object", op: del, old: fenced(""), lock: held, a: alice, rule: RuleStaleToken, want: "stores no token"},
		{name: "force-release user still needs the current token", op: update, old: fenced("12"), new: fenced("10"), lock: held, a: breakglass, rule: RuleStaleToken, want: "stale fencing token"},
		{name: "moving to another lock", op: update, old: fenced("12"), new: obj(map[string]string{locksv1alpha1.FencedByAnnotation: "other", locksv1alpha1.FencingTokenAnnotation: "12"}), lock: held, a: alice, rule: RuleFencedBy, want: `cannot move to lock "other"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateFencedWrite(tc.op, tc.old, tc.new, tc.lock, tc.a)
			if tc.want == "" {
				if len(errs) > 0 {
					t.Fatalf("denied: %v", errs)
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("errors = %v, want one containing %q", errs, tc.want)
			}
			msg := errs[0].Error()
			if !strings.Contains(msg, tc.want) || ruleOf(errs[0]) != tc.rule || !strings.Contains(msg, "[kubelock:"+string(tc.rule)+"]") {
				t.Fatalf("error = %v, want [kubelock:%s] containing %q", msg, tc.rule, tc.want)
			}
			// The lock's current token (12) is never revealed unless the
			// writer sent it or the object stores it.
			if twelve.MatchString(msg) && !twelve.MatchString(annotationsOf(tc.old)+annotationsOf(tc.new)) {
				t.Fatalf("the message reveals the lock's token: %s", msg)
			}
		})
	}
	if !onlyWriterErrors(ValidateFencedWrite(update, fenced("12"), fenced("12"), held, bob)) {
		t.Fatal("a non-holder with the current token fails on the writer alone")
	}
	if onlyWriterErrors(ValidateFencedWrite(update, fenced("12"), fenced("10"), held, bob)) {
		t.Fatal("a stale token is not only a writer error")
	}
}

var twelve = regexp.MustCompile(`\b12\b`)

func annotationsOf(o metav1.Object) string {
	if o == nil {
		return ""
	}
	return fmt.Sprint(o.GetAnnotations())
}
