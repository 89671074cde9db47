package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

func newSessionsCommand(o *options) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "List lock sessions: owner, TTL, last renewal, how many locks each holds",
		Long: `List the LockSessions in the namespace. A holding in a session is not renewed
itself: its session's owner renews the session, and every lock held in it ends
when the session lapses or is deleted.`,
		Example: `  kubelock sessions
  kubelock sessions -A -o name`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error { return o.sessions(cmd.Context(), all) },
	}
	o.addOutputFlag(cmd.Flags(), "name")
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "list sessions in all namespaces")
	return cmd
}

func (o *options) sessions(ctx context.Context, all bool) error {
	if err := o.checkOutput("name"); err != nil {
		return err
	}
	list := &locksv1alpha1.LockSessionList{}
	ns, err := o.listIn(ctx, list, "sessions", all)
	if err != nil {
		return err
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	switch o.output {
	case "table":
		if len(list.Items) == 0 {
			o.noneFound("sessions", ns, all)
			return nil
		}
		return printSessionTable(o.streams.Out, list.Items, o.now(), all)
	case "name":
		for _, s := range list.Items {
			printf(o.streams.Out, "%s.%s/%s\n", locksv1alpha1.LockSessionsResource, locksv1alpha1.GroupVersion.Group, s.Name)
		}
		return nil
	}
	list.APIVersion, list.Kind = locksv1alpha1.GroupVersion.String(), "LockSessionList"
	for i := range list.Items {
		list.Items[i].APIVersion, list.Items[i].Kind = locksv1alpha1.GroupVersion.String(), "LockSession"
	}
	return printData(o.streams.Out, o.output, list)
}

// printSessionTable writes the sessions table, its columns those of the CRD's printer columns.
func printSessionTable(w io.Writer, sessions []locksv1alpha1.LockSession, now time.Time, allNamespaces bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	var head []string
	if allNamespaces {
		head = append(head, "NAMESPACE")
	}
	printRow(tw, "", append(head, "NAME", "USER", "IDENTITY", "TTL", "RENEWED", "LOCKS", "AGE")...)
	for i := range sessions {
		s := &sessions[i]
		var row []string
		if allNamespaces {
			row = append(row, s.Namespace)
		}
		renewed := "-"
		if r := s.Status.RenewTime; r != nil {
			renewed = age(r.Time, now)
		}
		printRow(tw, "", append(row, s.Name, s.Spec.User, s.Spec.Identity, duration.HumanDuration(time.Duration(s.TTL())*time.Second),
			renewed, strconv.Itoa(int(s.Status.Locks)), age(s.CreationTimestamp.Time, now))...)
	}
	return tw.Flush()
}

// sessionLine is what describe says about the session named name: its TTL and
// last renewal, or why it cannot say.
func sessionLine(ctx context.Context, c client.Client, ns, name string, now time.Time) string {
	s := &locksv1alpha1.LockSession{}
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s)
	switch {
	case apierrors.IsNotFound(err):
		return name + " (gone: the controller ends what is held in it)"
	case apierrors.IsForbidden(err):
		return name + " (not shown: no permission to read sessions)"
	case err != nil:
		return fmt.Sprintf("%s (cannot read: %s)", name, oneLine(err))
	case s.DeletionTimestamp != nil:
		return name + " (closing)"
	}
	renewed := "never renewed"
	if r := s.Status.RenewTime; r != nil {
		renewed = "renewed " + duration.HumanDuration(now.Sub(r.Time)) + " ago"
	}
	return fmt.Sprintf("%s (of %s, TTL %s, %s, %d locks)", name, s.Spec.User,
		duration.HumanDuration(time.Duration(s.TTL())*time.Second), renewed, s.Status.Locks)
}

// forceReleaseSession deletes the session name: every holding in it ends
// (SessionClosed). It prints the locks held in the session just before.
func (o *options) forceReleaseSession(ctx context.Context, name string) error {
	c, ns, err := o.readClient()
	if err != nil {
		return err
	}
	s := &locksv1alpha1.LockSession{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return withCode(ExitNotFound, errorf("session %s/%s not found", ns, name))
		}
		return errorf("reading session %s/%s: %w", ns, name, err)
	}
	locks := &locksv1alpha1.DistributedLockList{}
	if err := c.List(ctx, locks, client.InNamespace(ns)); err != nil {
		return errorf("listing the locks of session %s/%s: %w", ns, name, err)
	}
	// The uid precondition: never a session re-created under the same name.
	err = c.Delete(ctx, s, client.Preconditions{UID: &s.UID})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return withCode(ExitNotFound, errorf("session %s/%s is already gone", ns, name))
	case denied(err) && strings.Contains(err.Error(), "[kubelock:"): // admission says who may
		return withCode(ExitDenied, errorf("force-release of session %s/%s of %s: %w", ns, name, s.Spec.User, err))
	case denied(err):
		return withCode(ExitDenied, errorf("force-release of session %s/%s of %s (needs the verb %s on %s, unless it is yours): %w",
			ns, name, s.Spec.User, locksv1alpha1.ForceReleaseVerb, locksv1alpha1.LockSessionsResource, err))
	case err != nil:
		return errorf("deleting session %s/%s: %w", ns, name, err)
	}
	var held []locksv1alpha1.DistributedLock
	for _, l := range locks.Items {
		if h := l.Status.Holder; h != nil && h.Session == name {
			held = append(held, l)
		}
	}
	sort.Slice(held, func(i, j int) bool { return held[i].Name < held[j].Name })
	printf(o.streams.Out, "force-released session %s/%s of %s (%s): %d lock(s) held in it end with %s\n",
		ns, name, s.Spec.User, s.Spec.Identity, len(held), locksv1alpha1.EndReasonSessionClosed)
	for _, l := range held {
		printf(o.streams.Out, "  %s (token %d, lease %s)\n", l.Name, l.Status.FencingToken, l.Status.Holder.LeaseID)
	}
	return nil
}
