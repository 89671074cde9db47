package cli

import (
	"context"
	"fmt"
	"sort"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

func newGetCommand(o *options) *cobra.Command {
	var all bool
	var w watchFlags
	cmd := &cobra.Command{
		Use:   "get [KEY...]",
		Short: "Show locks: type, holders, fencing token, time left on the lease, waiters, age",
		Long:  "Show the locks named by KEYs, or all locks in the namespace when no KEY is given; with --watch, then every change.",
		Example: `  kubelock get orders-db
  kubelock get -A
  kubelock get orders-db -w
  kubelock get 'orders/42' -o yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && all {
				return usageErrorf("--all-namespaces cannot be combined with KEYs")
			}
			switch {
			case w.watch:
				return o.watch(cmd.Context(), args, all, w)
			case len(args) == 0:
				return o.list(cmd.Context(), all)
			}
			return o.get(cmd.Context(), args)
		},
	}
	o.addOutputFlag(cmd.Flags())
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "list locks in all namespaces")
	w.add(cmd.Flags())
	return cmd
}

func newListCommand(o *options) *cobra.Command {
	var all bool
	var w watchFlags
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the locks in the namespace; with --watch, then every change",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if w.watch {
				return o.watch(cmd.Context(), nil, all, w)
			}
			return o.list(cmd.Context(), all)
		},
	}
	o.addOutputFlag(cmd.Flags())
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "list locks in all namespaces")
	w.add(cmd.Flags())
	return cmd
}

// watch checks the flags and keys, then watches the locks.
func (o *options) watch(ctx context.Context, keys []string, all bool, w watchFlags) error {
	if err := o.checkOutput(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return err
		}
	}
	return o.watchLocks(ctx, keys, all, w.events)
}

// listIn lists what into list, in the namespace of the flags (returned) or,
// with all, in all namespaces.
func (o *options) listIn(ctx context.Context, list client.ObjectList, what string, all bool) (string, error) {
	c, ns, err := o.readClient()
	if err != nil {
		return "", err
	}
	var opts []client.ListOption
	if !all {
		opts = append(opts, client.InNamespace(ns))
	}
	if err := c.List(ctx, list, opts...); err != nil {
		return "", errorf("listing %s: %w", what, err)
	}
	return ns, nil
}

// noneFound tells stderr that a listing found nothing, as kubectl does.
func (o *options) noneFound(what, ns string, all bool) {
	if all {
		printf(o.streams.ErrOut, "No %s found.\n", what)
	} else {
		printf(o.streams.ErrOut, "No %s found in namespace %s.\n", what, ns)
	}
}

func (o *options) get(ctx context.Context, keys []string) error {
	if err := o.checkOutput(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return err
		}
	}
	c, err := o.lockClient(ctx)
	if err != nil {
		return err
	}
	var locks []locksv1alpha1.DistributedLock
	for _, k := range keys {
		l, err := c.Get(ctx, k)
		if err != nil {
			return notFound(err, c.Namespace(), k, false)
		}
		locks = append(locks, withKind(*l))
	}
	switch {
	case o.output == "table":
		return printLockTable(o.streams.Out, locks, o.now(), false)
	case len(locks) == 1:
		return printData(o.streams.Out, o.output, locks[0])
	}
	return printData(o.streams.Out, o.output, lockList(locks))
}

func (o *options) list(ctx context.Context, all bool) error {
	if err := o.checkOutput(); err != nil {
		return err
	}
	list := &locksv1alpha1.DistributedLockList{}
	ns, err := o.listIn(ctx, list, "locks", all)
	if err != nil {
		return err
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	if o.output == "table" {
		if len(list.Items) == 0 {
			o.noneFound("locks", ns, all)
			return nil
		}
		return printLockTable(o.streams.Out, list.Items, o.now(), all)
	}
	items := make([]locksv1alpha1.DistributedLock, len(list.Items))
	for i := range list.Items {
		items[i] = withKind(list.Items[i])
	}
	return printData(o.streams.Out, o.output, lockList(items))
}

func lockList(items []locksv1alpha1.DistributedLock) *locksv1alpha1.DistributedLockList {
	l := &locksv1alpha1.DistributedLockList{Items: items}
	l.APIVersion = locksv1alpha1.GroupVersion.String()
	l.Kind = "DistributedLockList"
	return l
}

func newDescribeCommand(o *options) *cobra.Command {
	return o.keyCommand(&cobra.Command{
		Use:   "describe KEY",
		Short: "Show one lock in detail: type, holders (shared ones by slot, with their tokens), queue with modes and positions, recent acquisitions, events",
	}, nil, func(ctx context.Context, c *lock.Client, key, _ string) error {
		l, err := c.Get(ctx, key)
		if err != nil {
			return err
		}
		rc, _, err := o.readClient()
		if err != nil {
			return err
		}
		var d lockDetails
		if h := l.Status.Holder; h != nil && h.Session != "" {
			d.session = sessionLine(ctx, rc, l.Namespace, h.Session, o.now())
		}
		d.events, d.eventsNote = lockEvents(ctx, rc, l)
		return describeLock(o.streams.Out, l, d, o.now())
	})
}

// lockEvents lists the events about l; a lock user may lack the right to, and
// describe then says so instead of failing.
func lockEvents(ctx context.Context, c client.Client, l *locksv1alpha1.DistributedLock) ([]corev1.Event, string) {
	list := &corev1.EventList{}
	err := c.List(ctx, list, client.InNamespace(l.Namespace), client.MatchingFieldsSelector{Selector: fields.SelectorFromSet(fields.Set{
		"involvedObject.kind": "DistributedLock",
		"involvedObject.name": l.Name,
	})})
	switch {
	case apierrors.IsForbidden(err):
		return nil, "<not shown: no permission to list events>"
	case err != nil:
		return nil, fmt.Sprintf("<cannot list events: %s>", oneLine(err))
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.UID == "" || e.InvolvedObject.UID == l.UID {
			out = append(out, e)
		}
	}
	return out, ""
}
