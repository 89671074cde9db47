package rules

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

const (
	finalizer = "example.com/keep"
	forceKey  = locksv1alpha1.ForceDeleteAnnotation
)

// defaulted is l as admission sees it after the apiserver applied the CRD's defaults.
func defaulted(l *locksv1alpha1.DistributedLock) *locksv1alpha1.DistributedLock {
	l.Spec = locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Mutex, LeaseDurationSeconds: 30, MaxLeaseDurationSeconds: 300, MaxWaiters: ptr(128), HandoffTimeoutSeconds: 10}
	return l
}

// autoCreated is what pkg/lock creates on first use.
func autoCreated() *locksv1alpha1.DistributedLock {
	l := defaulted(free())
	l.Labels = map[string]string{locksv1alpha1.AutoCreatedLabel: "true"}
	l.Annotations = map[string]string{locksv1alpha1.KeyAnnotation: "orders/4711"}
	return l
}

func ptr(v int32) *int32 { return &v }

func with(l *locksv1alpha1.DistributedLock, edit func(*locksv1alpha1.DistributedLock)) *locksv1alpha1.DistributedLock {
	edit(l)
	return l
}

func annotate(v string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[forceKey] = v
	}
}

func label(v string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[locksv1alpha1.AutoCreatedLabel] = v
	}
}

func finalize(fs ...string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.Finalizers = fs }
}

// expectRules checks errs against the wanted rules ("" = allowed), in order.
func expectRules(t *testing.T, errs field.ErrorList, want ...Rule) {
	t.Helper()
	var got []Rule
	for _, e := range errs {
		got = append(got, RuleOf(e))
	}
	if len(want) == 0 {
		want = nil
	}
	if strings.Join(rulesStrings(got), ",") != strings.Join(rulesStrings(want), ",") {
		t.Fatalf("rules %v (%v), want %v", got, errs.ToAggregate(), want)
	}
}

func rulesStrings(rs []Rule) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	return out
}

func TestValidateCreate(t *testing.T) {
	user := Actor{Username: alice}
	admin := Actor{Username: "admin", Authorizer: allow(UpdateVerb)}
	operator := Actor{Username: "op", Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}
	cases := []struct {
		name  string
		lock  *locksv1alpha1.DistributedLock
		actor Actor
		// asks are the verbs the rules ask about, in order: only what the lock sets.
		asks []string
		want []Rule
	}{
		{name: "auto-created lock by a lock user", lock: autoCreated(), actor: user},
		{name: "spec left out by a lock user", lock: free(), actor: user},
		{name: "other labels and annotations", lock: with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) {
			l.Labels = map[string]string{"team": "a"}
			l.Annotations = map[string]string{"note": "x"}
		}), actor: user},
		{name: "lease 3600 by a lock user", lock: with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) {
			l.Spec.LeaseDurationSeconds, l.Spec.MaxLeaseDurationSeconds = 3600, 3600
		}), actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "maxWaiters 0 by a lock user", lock: with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = ptr(0) }),
			actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "hand-off 3600 by a lock user", lock: with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) { l.Spec.HandoffTimeoutSeconds = 3600 }),
			actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "finalizer by a lock user", lock: with(autoCreated(), finalize(finalizer)), actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "an RWMutex by a lock user", lock: with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) { l.Spec.Type = locksv1alpha1.RWMutex }),
			actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "a Semaphore by a lock user", lock: with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) {
			l.Spec.Type, l.Spec.Permits = locksv1alpha1.Semaphore, ptr(3)
		}), actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "a Semaphore by an administrator", lock: with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) {
			l.Spec.Type, l.Spec.Permits = locksv1alpha1.Semaphore, ptr(3)
		}), actor: admin, asks: []string{UpdateVerb}},
		{name: "force-delete annotation by a lock user", lock: with(autoCreated(), annotate("true")), actor: user,
			asks: []string{locksv1alpha1.ForceReleaseVerb, UpdateVerb}, want: []Rule{RuleForceDelete, RuleCreate}},
		{name: "16 labels and 16 annotations by a lock user", lock: with(autoCreated(), bulk(16, 16, 0)), actor: user},
		{name: "17 labels by a lock user", lock: with(autoCreated(), bulk(17, 0, 0)), actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "17 annotations by a lock user", lock: with(autoCreated(), bulk(0, 17, 0)), actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "two managedFields entries by a lock user", lock: with(autoCreated(), bulk(0, 0, 2)), actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "an ownerReference by a lock user", lock: with(autoCreated(), func(l *locksv1alpha1.DistributedLock) {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "mine", UID: "u1"}}
		}), actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "annotations of 4096 bytes by a lock user", lock: with(autoCreated(), keyAnnotationOf(MaxCreateAnnotationBytes)), actor: user},
		{name: "annotations of 4097 bytes by a lock user (red team)", lock: with(autoCreated(), keyAnnotationOf(MaxCreateAnnotationBytes+1)), actor: user,
			asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "annotations of 250 kB by an administrator", lock: with(autoCreated(), keyAnnotationOf(250_000)), actor: admin, asks: []string{UpdateVerb}},
		{name: "bulk metadata by an administrator", lock: with(autoCreated(), bulk(100, 100, 3)), actor: admin, asks: []string{UpdateVerb}},
		{name: "any spec and a finalizer by an administrator", lock: with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) {
			l.Spec.LeaseDurationSeconds, l.Spec.MaxWaiters, l.Finalizers = 3600, ptr(0), []string{finalizer}
		}), actor: admin, asks: []string{UpdateVerb}},
		{name: "force-delete annotation by an administrator without force-release", lock: with(autoCreated(), annotate("true")), actor: admin,
			asks: []string{locksv1alpha1.ForceReleaseVerb, UpdateVerb}, want: []Rule{RuleForceDelete}},
		{name: "force-delete annotation by an operator without update", lock: with(autoCreated(), annotate("true")), actor: operator,
			asks: []string{locksv1alpha1.ForceReleaseVerb, UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "force-delete annotation by an operator with update", lock: with(autoCreated(), annotate("true")),
			actor: Actor{Username: "op", Authorizer: allow(locksv1alpha1.ForceReleaseVerb, UpdateVerb)}, asks: []string{locksv1alpha1.ForceReleaseVerb, UpdateVerb}},
		// Only a client's create on first use carries the auto-created label.
		{name: "the auto-created label on maxWaiters 0 by an administrator", lock: with(autoCreated(), func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = ptr(0) }),
			actor: admin, asks: []string{UpdateVerb}, want: []Rule{RuleCreate}},
		{name: "the auto-created label on an RWMutex by a lock user", lock: with(autoCreated(), func(l *locksv1alpha1.DistributedLock) { l.Spec.Type = locksv1alpha1.RWMutex }),
			actor: user, asks: []string{UpdateVerb}, want: []Rule{RuleCreate, RuleCreate}},
		{name: "the auto-created label with a finalizer by an administrator", lock: with(autoCreated(), finalize(finalizer)),
			actor: admin, asks: []string{UpdateVerb}},
		{name: "the auto-created label false on maxWaiters 0 by an administrator", lock: with(autoCreated(), func(l *locksv1alpha1.DistributedLock) {
			l.Labels[locksv1alpha1.AutoCreatedLabel], l.Spec.MaxWaiters = "false", ptr(0)
		}), actor: admin, asks: []string{UpdateVerb}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, r := recording(tc.actor)
			expectRules(t, ValidateCreate(tc.lock, a), tc.want...)
			if !slices.Equal(r.asked, tc.asks) {
				t.Fatalf("asked about %v, want %v", r.asked, tc.asks)
			}
		})
	}
}

// bulk sets l's metadata to this many labels, annotations and managedFields entries.
func bulk(labels, annotations, managers int) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Labels, l.Annotations, l.ManagedFields = map[string]string{}, map[string]string{}, nil
		for i := range labels {
			l.Labels[fmt.Sprint("l", i)] = "v"
		}
		for i := range annotations {
			l.Annotations[fmt.Sprint("a", i)] = "v"
		}
		for i := range managers {
			l.ManagedFields = append(l.ManagedFields, metav1.ManagedFieldsEntry{Manager: fmt.Sprint("m", i)})
		}
	}
}

func TestCreateMessageNamesBulkMetadata(t *testing.T) {
	l := with(autoCreated(), bulk(17, 18, 2))
	l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "mine", UID: "u1"}}
	errs := ValidateCreate(l, Actor{Username: alice})
	want := `; lock l sets metadata.ownerReferences, metadata.labels (17, at most 16), metadata.annotations (18, at most 16), metadata.managedFields (2, at most 1)`
	if len(errs) != 1 || !strings.HasSuffix(errs[0].Detail, want) {
		t.Fatalf("got %v\nwant suffix %s", errs.ToAggregate(), want)
	}
}

// keyAnnotationOf sets l's annotations to the key annotation, n bytes with its key.
func keyAnnotationOf(n int) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Annotations = map[string]string{locksv1alpha1.KeyAnnotation: strings.Repeat("k", n-len(locksv1alpha1.KeyAnnotation))}
	}
}

func TestCreateMessageNamesAnnotationBytes(t *testing.T) {
	errs := ValidateCreate(with(autoCreated(), keyAnnotationOf(250_000)), Actor{Username: alice})
	want := `; lock l sets metadata.annotations (250000 bytes, at most 4096)`
	if len(errs) != 1 || !strings.HasSuffix(errs[0].Detail, want) {
		t.Fatalf("got %v\nwant suffix %s", errs.ToAggregate(), want)
	}
}

func TestCreateMessageNamesWhatIsNotDefault(t *testing.T) {
	l := with(defaulted(free()), func(l *locksv1alpha1.DistributedLock) {
		l.Spec.LeaseDurationSeconds, l.Spec.MaxWaiters, l.Spec.HandoffTimeoutSeconds = 3600, ptr(0), 3600
		l.Finalizers = []string{finalizer}
		annotate("true")(l)
	})
	errs := ValidateCreate(l, Actor{Username: alice})
	want := `[kubelock:create] user "alice" may create a lock only with the default spec, no finalizers and no locks.kubelock.io/force-delete annotation ` +
		`(anything else needs the "update" verb on distributedlocks.locks.kubelock.io in namespace ns); lock l sets ` +
		`spec.leaseDurationSeconds=3600 (default 30), spec.maxWaiters=0 (default 128), spec.handoffTimeoutSeconds=3600 (default 10), ` +
		`metadata.finalizers, annotation locks.kubelock.io/force-delete`
	if len(errs) != 2 || errs[1].Detail != want {
		t.Fatalf("got %v\nwant %s", errs.ToAggregate(), want)
	}
	wantForce := `[kubelock:force-delete] user "alice" may not set the locks.kubelock.io/force-delete annotation (to "true"): ` +
		`it needs the "force-release" verb on distributedlocks.locks.kubelock.io in namespace ns`
	if errs[0].Detail != wantForce {
		t.Fatalf("got %s\nwant %s", errs[0].Detail, wantForce)
	}
}

func TestValidateMetadataUpdate(t *testing.T) {
	mallory := Actor{Username: "mallory"}
	operator := Actor{Username: "op", Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}
	heldFinalized := func() *locksv1alpha1.DistributedLock { return with(heldBy(alice), finalize(finalizer, "other/f")) }
	cases := []struct {
		name    string
		old     *locksv1alpha1.DistributedLock
		edit    func(*locksv1alpha1.DistributedLock)
		actor   Actor
		changed bool
		// asks are the verbs the rules ask about: only what the write changes.
		asks []string
		want []Rule
	}{
		{name: "spec edit", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Spec.LeaseDurationSeconds = 60 }, actor: mallory},
		{name: "other annotation", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) { l.Annotations = map[string]string{"x": "y"} }, actor: mallory},
		{name: "add force-delete to a held lock", old: heldBy(alice), edit: annotate("true"), actor: mallory,
			changed: true, asks: []string{locksv1alpha1.ForceReleaseVerb}, want: []Rule{RuleForceDelete}},
		{name: "add force-delete to a free lock", old: free(), edit: annotate("true"), actor: mallory,
			changed: true, asks: []string{locksv1alpha1.ForceReleaseVerb}, want: []Rule{RuleForceDelete}},
		{name: "change force-delete", old: with(heldBy(alice), annotate("false")), edit: annotate("true"), actor: mallory,
			changed: true, asks: []string{locksv1alpha1.ForceReleaseVerb}, want: []Rule{RuleForceDelete}},
		{name: "add force-delete with the verb", old: heldBy(alice), edit: annotate("true"), actor: operator,
			changed: true, asks: []string{locksv1alpha1.ForceReleaseVerb}},
		{name: "remove force-delete", old: with(heldBy(alice), annotate("true")), edit: func(l *locksv1alpha1.DistributedLock) { delete(l.Annotations, forceKey) },
			actor: mallory, changed: true},
		{name: "remove a finalizer of a held lock", old: heldFinalized(), edit: finalize("other/f"), actor: mallory,
			changed: true, asks: []string{locksv1alpha1.ForceReleaseVerb}, want: []Rule{RuleHeldDelete}},
		{name: "remove all finalizers of a held lock", old: heldFinalized(), edit: finalize(), actor: mallory,
			changed: true, asks: []string{locksv1alpha1.ForceReleaseVerb}, want: []Rule{RuleHeldDelete}},
		{name: "remove a finalizer of a held lock and add force-delete", old: heldFinalized(), edit: func(l *locksv1alpha1.DistributedLock) {
			finalize()(l)
			annotate("true")(l)
		}, actor: mallory, changed: true, asks: []string{locksv1alpha1.ForceReleaseVerb}, want: []Rule{RuleForceDelete, RuleHeldDelete}},
		{name: "remove a finalizer of a held lock with the verb", old: heldFinalized(), edit: finalize(), actor: operator,
			changed: true, asks: []string{locksv1alpha1.ForceReleaseVerb}},
		{name: "remove a finalizer of a held lock marked for forced deletion", old: with(heldFinalized(), annotate("true")), edit: finalize(),
			actor: mallory, changed: true},
		{name: "remove a finalizer of a free lock", old: with(free(), finalize(finalizer)), edit: finalize(), actor: mallory, changed: true},
		{name: "add a finalizer to a held lock", old: heldBy(alice), edit: finalize(finalizer), actor: mallory, changed: true},
		{name: "reorder finalizers of a held lock", old: heldFinalized(), edit: finalize("other/f", finalizer), actor: mallory, changed: true},
		{name: "add the auto-created label", old: defaulted(free()), edit: label("true"), actor: mallory, changed: true, want: []Rule{RuleCreate}},
		{name: "add the auto-created label with every verb", old: defaulted(free()), edit: label("true"),
			actor: Actor{Username: "op", Authorizer: allow(locksv1alpha1.ForceReleaseVerb, UpdateVerb)}, changed: true, want: []Rule{RuleCreate}},
		{name: "turn the auto-created label from false to true", old: with(defaulted(free()), label("false")), edit: label("true"), actor: mallory,
			changed: true, want: []Rule{RuleCreate}},
		{name: "remove the auto-created label", old: autoCreated(), edit: func(l *locksv1alpha1.DistributedLock) { delete(l.Labels, locksv1alpha1.AutoCreatedLabel) },
			actor: mallory, changed: true},
		{name: "keep the auto-created label, change the spec", old: autoCreated(), edit: func(l *locksv1alpha1.DistributedLock) { l.Spec.MaxWaiters = ptr(0) }, actor: mallory},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next := tc.old.DeepCopy()
			tc.edit(next)
			if got := MetadataChanged(tc.old, next); got != tc.changed {
				t.Fatalf("MetadataChanged = %v, want %v", got, tc.changed)
			}
			a, r := recording(tc.actor)
			expectRules(t, ValidateMetadataUpdate(tc.old, next, a), tc.want...)
			if !slices.Equal(r.asked, tc.asks) {
				t.Fatalf("asked about %v, want %v", r.asked, tc.asks)
			}
		})
	}
}

func TestHeldFinalizerMessage(t *testing.T) {
	old := with(heldBy(alice), finalize(finalizer))
	errs := ValidateMetadataUpdate(old, with(old.DeepCopy(), finalize()), Actor{Username: "mallory"})
	want := `[kubelock:held-delete] lock l is held by alice (lease lease-a); removing its finalizers example.com/keep is a delete: ` +
		`release it first, or annotate it locks.kubelock.io/force-delete=true, or use an account with the "force-release" verb`
	if len(errs) != 1 || errs[0].Detail != want {
		t.Fatalf("got %v\nwant %s", errs.ToAggregate(), want)
	}
}

// TestSpecDefaultsMatchCRD holds specDefaults (and so the policy's copy, which
// test/admission proves equal) to the generated CRD: every spec field of the
// CRD has its default in the list.
func TestSpecDefaultsMatchCRD(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "config", "crd", "bases", "locks.kubelock.io_distributedlocks.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, crd); err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{}
	for _, d := range specDefaults {
		defaults[d.field] = d.value
	}
	for _, v := range crd.Spec.Versions {
		props := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties
		if len(props) == 0 {
			t.Fatalf("%s: no spec properties", v.Name)
		}
		for name, p := range props {
			want, ok := defaults[name]
			switch {
			case !ok && p.Default == nil:
				// No default: set means not default, in both engines.
			case !ok:
				t.Errorf("%s: spec.%s is not in specDefaults (rules/metadata.go) nor in the policy's specDefaults", v.Name, name)
			case p.Default == nil || string(p.Default.Raw) != want:
				t.Errorf("%s: spec.%s defaults to %v in the CRD, %s in specDefaults", v.Name, name, p.Default, want)
			}
		}
	}
	// What the apiserver fills in equals the list: a defaulted spec is default.
	if bad := nonDefault(autoCreated()); len(bad) != 0 {
		t.Fatalf("a defaulted spec is not default: %v", bad)
	}
}

// TestPolicySpecDefaultsMatch holds the policy's copy of the defaults
// (config/policy, variables specFields and specDefaults) to specDefaults.
func TestPolicySpecDefaultsMatch(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "config", "policy", "metadata_validating_admission_policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	if err := yaml.UnmarshalStrict(b, vap); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range vap.Spec.Variables {
		vars[v.Name] = v.Expression
	}
	var fields, pairs []string
	for _, d := range specDefaults {
		fields = append(fields, "'"+d.field+"'")
		pairs = append(pairs, fmt.Sprintf("'%s': '%s'", d.field, plain([]byte(d.value))))
	}
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	if got, want := norm(vars["specFields"]), "["+strings.Join(fields, ", ")+"]"; got != want {
		t.Errorf("policy specFields = %s, want %s", got, want)
	}
	if got, want := norm(vars["specDefaults"]), "{"+strings.Join(pairs, ", ")+"}"; got != want {
		t.Errorf("policy specDefaults = %s, want %s", got, want)
	}
}

// TestMatchConditionsAgree holds the webhook registration's matchConditions
// (config/webhook, from handler.go's marker) to the metadata policy's: the
// same main-resource UPDATEs reach either engine.
func TestMatchConditionsAgree(t *testing.T) {
	read := func(path string, into any) {
		b, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatal(err)
		}
	}
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	read("config/policy/metadata_validating_admission_policy.yaml", vap)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	read("config/webhook/manifests.yaml", cfg)
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	var webhook []admissionregistrationv1.MatchCondition
	for _, w := range cfg.Webhooks {
		if w.Name == "vdistributedlock-meta.kubelock.io" {
			webhook = w.MatchConditions
		}
	}
	if len(webhook) != 1 || len(vap.Spec.MatchConditions) != 1 {
		t.Fatalf("want one matchCondition each, got webhook %v, policy %v", webhook, vap.Spec.MatchConditions)
	}
	if w, p := norm(webhook[0].Expression), norm(vap.Spec.MatchConditions[0].Expression); w != p {
		t.Fatalf("webhook matchCondition\n%s\npolicy\n%s", w, p)
	}
}

func TestValidateDelete(t *testing.T) {
	forced := heldBy(alice)
	forced.Annotations = map[string]string{locksv1alpha1.ForceDeleteAnnotation: "true"}
	cases := []struct {
		name  string
		lock  *locksv1alpha1.DistributedLock
		actor Actor
		deny  bool
	}{
		{name: "free lock", lock: free(), actor: Actor{Username: bob}},
		{name: "held lock", lock: heldBy(alice), actor: Actor{Username: alice}, deny: true},
		{name: "held lock with the annotation", lock: forced, actor: Actor{Username: bob}},
		{name: "held lock with the force-release verb", lock: heldBy(alice), actor: Actor{Username: bob, Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateDelete(tc.lock, tc.actor)
			if got := len(errs) > 0; got != tc.deny {
				t.Fatalf("denied = %v (%v), want %v", got, errs.ToAggregate(), tc.deny)
			}
			if tc.deny && !strings.Contains(errs.ToAggregate().Error(), "[kubelock:held-delete]") {
				t.Fatalf("message %v lacks the rule", errs.ToAggregate())
			}
		})
	}
}

func TestValidateDeleteOfSharedLock(t *testing.T) {
	l := reading(typed(locksv1alpha1.Semaphore, 3), alice, bob)
	errs := ValidateDelete(l, Actor{Username: carol})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "[kubelock:held-delete] lock l is held by alice (lease lease-alice)") {
		t.Fatalf("got %v", errs.ToAggregate())
	}
	if errs := ValidateDelete(l, Actor{Username: carol, Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}); len(errs) > 0 {
		t.Fatalf("force-release denied: %v", errs.ToAggregate())
	}
}
