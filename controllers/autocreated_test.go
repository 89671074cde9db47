package controllers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// A lock user may create a lock with the auto-created label (with the default
// spec: how clients create on first use). An administrator's later apply
// keeps the label: kubectl's client-side apply leaves what its last applied
// configuration never had, a server-side apply what another manager owns.
// The lock is the administrator's from then on, and never deleted as idle.
var _ = Describe("idle deletion of auto-created locks an administrator applied", func() {
	It("keeps a lock an administrator applied, client-side or server-side, with another spec or the same, and deletes one nobody touched", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		userCfg, err := env.UserConfig(ctx, "auto-creator")
		Expect(err).NotTo(HaveOccurred())
		lockUser, err := client.New(userCfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		kubectl, err := env.Kubectl("lock-admin")
		Expect(err).NotTo(HaveOccurred())
		manifests := GinkgoT().TempDir()

		// create is a lock user's create on first use, under fieldManager manager.
		create := func(name, manager string) types.NamespacedName {
			l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
				Labels:      map[string]string{locksv1alpha1.AutoCreatedLabel: "true"},
				Annotations: map[string]string{locksv1alpha1.KeyAnnotation: name}}}
			Expect(lockUser.Create(ctx, l, client.FieldOwner(manager))).To(Succeed())
			return client.ObjectKeyFromObject(l)
		}
		// apply is the administrator's kubectl apply of the lock with spec, and flags.
		apply := func(key types.NamespacedName, spec string, flags ...string) {
			path := filepath.Join(manifests, key.Name+".yaml")
			manifest := fmt.Sprintf("apiVersion: %s\nkind: DistributedLock\nmetadata:\n  namespace: %s\n  name: %s\nspec: %s\n",
				locksv1alpha1.GroupVersion, key.Namespace, key.Name, spec)
			Expect(os.WriteFile(path, []byte(manifest), 0o600)).To(Succeed())
			out, err := kubectl(append([]string{"apply", "-f", path}, flags...)...)
			Expect(err).NotTo(HaveOccurred(), out)
		}
		serverSide := []string{"--server-side", "--force-conflicts"}

		untouched := create("untouched", "kubelock")
		declared := map[string]types.NamespacedName{}
		for _, c := range []struct {
			name, spec string
			flags      []string
		}{
			{"client-side-other-spec", "{maxWaiters: 0}", nil},
			{"client-side-same-spec", "{}", nil},
			{"server-side-other-spec", "{maxWaiters: 0}", serverSide},
			{"server-side-same-spec", "{}", serverSide},
		} {
			declared[c.name] = create(c.name, "kubelock")
			apply(declared[c.name], c.spec, c.flags...)
		}
		// A lock user who created the lock under the manager name of kubectl's
		// client-side apply: the administrator's apply adds no entry to
		// managedFields but stamps that one again, in a later second (the
		// stamps have second precision).
		key := create("client-side-same-manager", "kubectl-client-side-apply")
		created := getLock(ctx, key).CreationTimestamp
		Eventually(func() bool { return time.Now().Truncate(time.Second).After(created.Time) }).Should(BeTrue())
		apply(key, "{}")
		declared["client-side-same-manager"] = key

		for name, key := range declared {
			Expect(getLock(ctx, key).Labels).To(HaveKeyWithValue(locksv1alpha1.AutoCreatedLabel, "true"), "%s: the apply kept the label", name)
		}
		startController()
		Eventually(func() error {
			return env.Client.Get(ctx, untouched, &locksv1alpha1.DistributedLock{})
		}).Should(Satisfy(apierrors.IsNotFound), "the controller deletes an untouched auto-created lock")
		Consistently(func(g Gomega) {
			for name, key := range declared {
				g.Expect(env.Client.Get(ctx, key, &locksv1alpha1.DistributedLock{})).To(Succeed(), "%s was deleted", name)
			}
		}, idleTimeout+time.Second).Should(Succeed())
		Expect(getLock(ctx, declared["server-side-other-spec"]).Spec.MaxWaiters).To(Equal(ptr.To[int32](0)))
	})
})
