package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// createFlags are the spec an administrator declares with create.
type createFlags struct {
	lockType   string
	permits    int32
	lease      time.Duration
	maxLease   time.Duration
	maxWaiters int32
}

var lockTypes = []string{string(locksv1alpha1.Mutex), string(locksv1alpha1.RWMutex), string(locksv1alpha1.Semaphore)}

func newCreateCommand(o *options) *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create KEY [--type Mutex|RWMutex|Semaphore] [--permits N]",
		Short: "Declare a lock: its type (Mutex, RWMutex, Semaphore), permits and lease limits (an administrator's write)",
		Long: `Create the DistributedLock for KEY with the spec the flags give. The type is
fixed for the lock's life; a Semaphore's permits may grow later (kubectl edit),
never shrink.

  Mutex      one holder at a time (the default)
  RWMutex    one writer, or any number of readers ("acquire --shared", "run --shared")
  Semaphore  up to --permits holders at once, each on its own slot with its own
             fencing token; every acquire of it is shared

Declaring a spec is an administrator's act: it needs the update verb on
distributedlocks. A lock user (the kubelock-lock-user role) may only create a
lock with the default spec, as "acquire --create" does; admission denies
anything else with a [kubelock:create] message and create exits with 77.`,
		Example: `  kubectl lock create orders-db
  kubectl lock create catalog --type RWMutex --lease 1m
  kubectl lock create indexers --type Semaphore --permits 3`,
		Args: exactArgs(1, "one KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if err := checkKey(key); err != nil {
				return err
			}
			if err := o.checkOutput(); err != nil {
				return err
			}
			obj, err := f.lock(cmd, key)
			if err != nil {
				return err
			}
			return o.create(cmd.Context(), obj)
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&f.lockType, "type", string(locksv1alpha1.Mutex), "who may hold the lock at once: "+orList(lockTypes)+"; fixed for the lock's life")
	flags.Int32Var(&f.permits, "permits", 0, fmt.Sprintf("a Semaphore's permits: holders at once, 1..%d (required with --type Semaphore, only with it)", locksv1alpha1.MaxSharedHolders))
	flags.DurationVar(&f.lease, "lease", 0, fmt.Sprintf("the lease a client gets when it asks for none, whole seconds (default %ds)", locksv1alpha1.DefaultLeaseDurationSeconds))
	flags.DurationVar(&f.maxLease, "max-lease", 0, fmt.Sprintf("the longest lease a client may ask for, whole seconds (default %ds)", locksv1alpha1.DefaultMaxLeaseDurationSeconds))
	flags.Int32Var(&f.maxWaiters, "max-waiters", 0, fmt.Sprintf("how many may wait in the lock's queue, 0..%d (default %d)", locksv1alpha1.MaxWaitersLimit, locksv1alpha1.DefaultMaxWaiters))
	o.addOutputFlag(flags)
	return cmd
}

// lock is the object the flags describe, checked as the CRD will check it:
// a usage error names the flag before anything is sent.
func (f *createFlags) lock(cmd *cobra.Command, key string) (*locksv1alpha1.DistributedLock, error) {
	spec := locksv1alpha1.DistributedLockSpec{}
	for _, t := range lockTypes {
		if strings.EqualFold(f.lockType, t) {
			spec.Type = locksv1alpha1.LockType(t)
		}
	}
	flags := cmd.Flags()
	switch {
	case spec.Type == "":
		return nil, usageErrorf("--type must be %s, got %q", orList(lockTypes), f.lockType)
	case spec.Type == locksv1alpha1.Semaphore && !flags.Changed("permits"):
		return nil, usageErrorf("--type Semaphore needs --permits N (how many may hold it at once, 1..%d)", locksv1alpha1.MaxSharedHolders)
	case spec.Type != locksv1alpha1.Semaphore && flags.Changed("permits"):
		return nil, usageErrorf("--permits goes with --type Semaphore (a %s has no permits)", spec.Type)
	case flags.Changed("permits") && (f.permits < 1 || f.permits > locksv1alpha1.MaxSharedHolders):
		return nil, usageErrorf("--permits must be within 1..%d, got %d", locksv1alpha1.MaxSharedHolders, f.permits)
	case flags.Changed("max-waiters") && (f.maxWaiters < 0 || f.maxWaiters > locksv1alpha1.MaxWaitersLimit):
		return nil, usageErrorf("--max-waiters must be within 0..%d, got %d", locksv1alpha1.MaxWaitersLimit, f.maxWaiters)
	}
	if flags.Changed("permits") {
		spec.Permits = &f.permits
	}
	if flags.Changed("max-waiters") {
		spec.MaxWaiters = &f.maxWaiters
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
		into *int32
	}{{"--lease", f.lease, &spec.LeaseDurationSeconds}, {"--max-lease", f.maxLease, &spec.MaxLeaseDurationSeconds}} {
		if d.v == 0 {
			continue
		}
		if d.v < time.Second || d.v > locksv1alpha1.MaxLeaseDurationSeconds*time.Second || d.v%time.Second != 0 {
			return nil, usageErrorf("%s must be whole seconds within 1s..%ds, got %s", d.flag, locksv1alpha1.MaxLeaseDurationSeconds, d.v)
		}
		*d.into = int32(d.v / time.Second)
	}
	lease, maxLease := orDefault(spec.LeaseDurationSeconds, locksv1alpha1.DefaultLeaseDurationSeconds), orDefault(spec.MaxLeaseDurationSeconds, locksv1alpha1.DefaultMaxLeaseDurationSeconds)
	if lease > maxLease {
		return nil, usageErrorf("--lease %s exceeds the longest lease clients may ask for (%s): raise --max-lease", secs(lease), secs(maxLease))
	}
	name, _ := lock.NameForKey(key) // checked by checkKey
	return &locksv1alpha1.DistributedLock{
		TypeMeta:   metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "DistributedLock"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{locksv1alpha1.KeyAnnotation: key}},
		Spec:       spec,
	}, nil
}

func orDefault(v, def int32) int32 {
	if v == 0 {
		return def
	}
	return v
}

// create sends obj to the namespace of the flags and prints what was stored.
func (o *options) create(ctx context.Context, obj *locksv1alpha1.DistributedLock) error {
	c, ns, err := o.readClient()
	if err != nil {
		return err
	}
	obj.Namespace = ns
	if err := c.Create(ctx, obj); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return errorf("lock %s/%s already exists (its type is fixed; delete it first to change it)", ns, obj.Name)
		}
		// Admission's [kubelock:create] and RBAC's refusal say what is needed; keep them whole.
		return errorf("creating lock %s/%s: %w", ns, obj.Name, err)
	}
	if o.output != "table" {
		return printData(o.streams.Out, o.output, withKind(*obj))
	}
	printf(o.streams.Out, "created %s/%s: %s\n", ns, obj.Name, typeLine(obj))
	return nil
}
