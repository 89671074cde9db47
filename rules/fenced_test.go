package rules

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/escape"
)

func TestValidateFencedWrite(t *testing.T) {
	obj := func(ann map[string]string) metav1.Object { return &metav1.ObjectMeta{Annotations: ann} }
	annotatedBy := func(lock, token string) map[string]string {
		m := map[string]string{locksv1alpha1.FencedByAnnotation: lock}
		if token != "" {
			m[locksv1alpha1.FencingTokenAnnotation] = token
		}
		return m
	}
	fencedBy := func(lock, token string) metav1.Object {
		return &metav1.ObjectMeta{Labels: map[string]string{locksv1alpha1.FencedLabel: "true"}, Annotations: annotatedBy(lock, token)}
	}
	// unlabelled carries the annotations another writer may have planted on
	// an object nobody fenced: without the label, the webhook never saw them.
	unlabelled := func(lock, token string) metav1.Object { return obj(annotatedBy(lock, token)) }
	fenced := func(token string) metav1.Object { return fencedBy("db", token) }
	held := FencedLock{Exists: true, Token: 12, HolderUser: "alice"}
	alice, bob := Actor{Username: "alice"}, Actor{Username: "bob"}
	breakglass := Actor{Username: "root", Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}
	const (
		create = Create
		update = Update
		del    = Delete
	)
	cases := []struct {
		name     string
		op       Operation
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
		// Red team: what another writer annotated before the object was fenced.
		{name: "fencing over a planted token", op: update, old: unlabelled("db", "9223372036854775806"), new: fenced("12"), lock: held, a: alice},
		{name: "fencing over a planted fence of another lock", op: update, old: unlabelled("other", "1"), new: fenced("12"), lock: held, a: alice},
		{name: "fencing over a planted fence that names no lock", op: update, old: unlabelled("../x", ""), new: fenced("12"), lock: held, a: alice},

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
		{name: "fenced by 100 kB, no lock's name", op: create, new: fencedBy(strings.Repeat("x", 100<<10), "12"), lock: held, a: alice, rule: RuleFencedBy, want: "does not name a lock (102400 bytes): must be no more than 253 characters"},
		{name: "fenced by a path", op: create, new: fencedBy("../db", "12"), lock: held, a: alice, rule: RuleFencedBy, want: `annotation locks.kubelock.io/fenced-by="../db" does not name a lock`},
		{name: "fenced by an upper-case name", op: update, old: fenced("12"), new: fencedBy("DB", "12"), lock: held, a: alice, rule: RuleFencedBy, want: `"DB" does not name a lock`},
		{name: "stored fenced-by that names no lock", op: del, old: fencedBy("db\x1b[2J", "12"), lock: held, a: alice, rule: RuleFencedBy, want: `"db\x1b[2J" does not name a lock`},
		{name: "malformed 100 kB token", op: update, old: fenced("12"), new: fencedBy("db", strings.Repeat("9", 100<<10)+"x"), lock: held, a: alice, rule: RuleStaleToken, want: "=\"" + strings.Repeat("9", clipLen-len(escape.Ellipsis)) + "…\" is not a positive integer"},
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
			if len(msg) > maxDenial {
				t.Fatalf("a denial of %d bytes: %.200s…", len(msg), msg)
			}
			if !strings.Contains(msg, tc.want) || RuleOf(errs[0]) != tc.rule || !strings.Contains(msg, "[kubelock:"+string(tc.rule)+"]") {
				t.Fatalf("error = %v, want [kubelock:%s] containing %q", msg, tc.rule, tc.want)
			}
			// The lock's current token (12) is never revealed unless the
			// writer sent it or the object stores it.
			if twelve.MatchString(msg) && !twelve.MatchString(annotationsOf(tc.old)+annotationsOf(tc.new)) {
				t.Fatalf("the message reveals the lock's token: %s", msg)
			}
		})
	}
	// The force-release verb is asked only when the writer is all that is wrong.
	a, r := recording(bob)
	if ValidateFencedWrite(update, fenced("12"), fenced("12"), held, a); !slices.Equal(r.asked, []string{locksv1alpha1.ForceReleaseVerb}) {
		t.Fatalf("a non-holder with the current token: asked about %v, want force-release (it fails on the writer alone)", r.asked)
	}
	a, r = recording(bob)
	if ValidateFencedWrite(update, fenced("12"), fenced("10"), held, a); len(r.asked) > 0 {
		t.Fatalf("a stale token: asked about %v, want nothing (it is not only a writer error)", r.asked)
	}
}

// maxDenial bounds a denial: it quotes what a user wrote only clipped.
const maxDenial = 1024

var twelve = regexp.MustCompile(`\b12\b`)

func annotationsOf(o metav1.Object) string {
	if o == nil {
		return ""
	}
	return fmt.Sprint(o.GetAnnotations())
}
