package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// scheme knows the built-in types and the kubelock API.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s) // static registrations; cannot fail
	_ = locksv1alpha1.AddToScheme(s)  // same
	return s
}()

// printData writes v as JSON or YAML.
func printData(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// withKind fills apiVersion and kind, which typed clients leave empty.
func withKind(l locksv1alpha1.DistributedLock) locksv1alpha1.DistributedLock {
	l.APIVersion = locksv1alpha1.GroupVersion.String()
	l.Kind = "DistributedLock"
	return l
}

// lockKey is the business key of a lock: its annotation, else its name.
func lockKey(l *locksv1alpha1.DistributedLock) string {
	if k := l.Annotations[locksv1alpha1.KeyAnnotation]; k != "" {
		return k
	}
	return l.Name
}

// leaseEnd is when the holder's lease runs out by its own renewTime; informational.
func leaseEnd(h *locksv1alpha1.LockHolder) time.Time {
	from := h.AcquireTime.Time
	if h.RenewTime != nil {
		from = h.RenewTime.Time
	}
	return from.Add(time.Duration(h.LeaseDurationSeconds) * time.Second)
}

// expiresIn is the time left on the holder's lease, "-" when free, "session"
// when the holding lives as long as its session, and "overdue Ns" when the
// holder's last renewal is older than its lease (the controller expires it shortly).
func expiresIn(l *locksv1alpha1.DistributedLock, now time.Time) string {
	h := l.Status.Holder
	switch {
	case h == nil:
		return "-"
	case h.Session != "":
		return "session"
	}
	left := leaseEnd(h).Sub(now)
	if left < 0 {
		return "overdue " + duration.HumanDuration(-left)
	}
	return duration.HumanDuration(left)
}

func age(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printLockTable writes the get/list table. A KEY column appears when some
// lock's key differs from its name.
func printLockTable(w io.Writer, locks []locksv1alpha1.DistributedLock, now time.Time, allNamespaces bool) error {
	t := newLockTable(locks, allNamespaces)
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	printRow(tw, "", t.header()...)
	for i := range locks {
		printRow(tw, "", t.row(&locks[i], now)...)
	}
	return tw.Flush()
}

// lockTable is the get/list table's choice of columns.
type lockTable struct{ allNamespaces, showKey bool }

// newLockTable shows a NAMESPACE column with allNamespaces, and a KEY column
// when some lock's key differs from its name.
func newLockTable(locks []locksv1alpha1.DistributedLock, allNamespaces bool) lockTable {
	t := lockTable{allNamespaces: allNamespaces}
	for i := range locks {
		if lockKey(&locks[i]) != locks[i].Name {
			t.showKey = true
		}
	}
	return t
}

func (t lockTable) header() []string {
	var head []string
	if t.allNamespaces {
		head = append(head, "NAMESPACE")
	}
	head = append(head, "NAME")
	if t.showKey {
		head = append(head, "KEY")
	}
	return append(head, "HOLDER", "TOKEN", "EXPIRES-IN", "WAITERS", "AGE")
}

func (t lockTable) row(l *locksv1alpha1.DistributedLock, now time.Time) []string {
	var row []string
	if t.allNamespaces {
		row = append(row, l.Namespace)
	}
	row = append(row, l.Name)
	if t.showKey {
		row = append(row, lockKey(l))
	}
	holder := "<free>"
	if h := l.Status.Holder; h != nil {
		holder = h.Identity
	}
	return append(row, holder, strconv.FormatInt(l.Status.FencingToken, 10), expiresIn(l, now),
		strconv.Itoa(len(l.Status.Waiters)), age(l.CreationTimestamp.Time, now))
}

// stamp is an absolute time with its age, e.g. "2026-05-01T10:00:00Z (3m ago)".
func stamp(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), duration.HumanDuration(now.Sub(t)))
}

func until(t time.Time, now time.Time) string {
	if d := t.Sub(now); d >= 0 {
		return "in " + duration.HumanDuration(d)
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}

// lockDetails is what describe reads besides the lock.
type lockDetails struct {
	// session describes the holder's session (sessionLine); empty without one.
	session string
	events  []corev1.Event
	// eventsNote replaces the events table when they could not be read.
	eventsNote string
}

// describeLock writes the describe view: spec, holder, queue with positions,
// recent acquisitions, conditions and events.
func describeLock(w io.Writer, l *locksv1alpha1.DistributedLock, d lockDetails, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	p := func(format string, args ...any) { printf(tw, format+"\n", args...) }
	secs := func(s int32) string { return (time.Duration(s) * time.Second).String() }
	p("Name:\t%s", l.Name)
	p("Namespace:\t%s", l.Namespace)
	p("Key:\t%s", lockKey(l))
	auto := "no"
	if l.Labels[locksv1alpha1.AutoCreatedLabel] == "true" {
		auto = "yes (deleted by the controller once idle)"
	}
	p("Auto-created:\t%s", auto)
	p("Created:\t%s", stamp(l.CreationTimestamp.Time, now))
	maxWaiters := "-"
	if l.Spec.MaxWaiters != nil {
		maxWaiters = strconv.Itoa(int(*l.Spec.MaxWaiters))
	}
	p("Lease:\t%s (clients may ask up to %s)", secs(l.Spec.LeaseDurationSeconds), secs(l.Spec.MaxLeaseDurationSeconds))
	p("Max waiters:\t%s", maxWaiters)
	p("Hand-off timeout:\t%s", secs(l.Spec.HandoffTimeoutSeconds))
	p("Fencing token:\t%d", l.Status.FencingToken)
	p("Transitions:\t%d", l.Status.Transitions)
	if h := l.Status.Holder; h != nil {
		p("Holder:")
		p("  Identity:\t%s", h.Identity)
		p("  User:\t%s", h.User)
		if h.PodName != "" {
			p("  Pod:\t%s (uid %s)", h.PodName, orDash(h.PodUID))
		}
		p("  Lease ID:\t%s", h.LeaseID)
		p("  Request ID:\t%s", h.RequestID)
		p("  Lease:\t%s", secs(h.LeaseDurationSeconds))
		p("  Acquired:\t%s", stamp(h.AcquireTime.Time, now))
		if h.Session != "" {
			p("  Session:\t%s", d.session)
			p("  Expires:\twith its session (a holding in a session is not renewed itself)")
		} else {
			if h.RenewTime != nil {
				p("  Renewed:\t%s", stamp(h.RenewTime.Time, now))
			}
			p("  Expires:\t%s (by the holder's clock)", expiresIn(l, now))
		}
	} else {
		p("Holder:\t<free>")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	inSessions := slices.ContainsFunc(l.Status.Waiters, func(q locksv1alpha1.Waiter) bool { return q.Session != "" })
	section(w, "Queue", len(l.Status.Waiters), func(tw *tabwriter.Writer) {
		head := []string{"POSITION", "IDENTITY", "USER", "WAITING", "GIVES UP", "REQUEST-ID"}
		if inSessions {
			head = append(head, "SESSION")
		}
		printRow(tw, "  ", head...)
		for i, q := range l.Status.Waiters {
			row := []string{strconv.Itoa(i + 1), q.Identity, q.User,
				duration.HumanDuration(now.Sub(q.EnqueueTime.Time)), until(q.Deadline.Time, now), q.RequestID}
			if inSessions {
				row = append(row, orDash(q.Session))
			}
			printRow(tw, "  ", row...)
		}
	})
	section(w, "Recent acquisitions (oldest first)", len(l.Status.RecentAcquisitions), func(tw *tabwriter.Writer) {
		printRow(tw, "  ", "TOKEN", "IDENTITY", "ENDED", "REASON", "BY", "LEASE-ID", "MESSAGE")
		for _, f := range l.Status.RecentAcquisitions {
			printRow(tw, "  ", strconv.FormatInt(f.FencingToken, 10), f.Identity,
				duration.HumanDuration(now.Sub(f.EndTime.Time))+" ago", string(f.EndReason), f.EndedBy, f.LeaseID, orDash(f.Message))
		}
	})
	section(w, "Conditions", len(l.Status.Conditions), func(tw *tabwriter.Writer) {
		printRow(tw, "  ", "TYPE", "STATUS", "REASON", "SINCE", "MESSAGE")
		for _, c := range l.Status.Conditions {
			printRow(tw, "  ", c.Type, string(c.Status), c.Reason,
				duration.HumanDuration(now.Sub(c.LastTransitionTime.Time)), orDash(c.Message))
		}
	})
	if d.eventsNote != "" {
		printf(w, "%s%s\n", label("Events"), d.eventsNote)
		return nil
	}
	events := d.events
	sort.SliceStable(events, func(i, j int) bool { return eventTime(&events[i]).Before(eventTime(&events[j])) })
	section(w, "Events", len(events), func(tw *tabwriter.Writer) {
		printRow(tw, "  ", "TYPE", "REASON", "AGE", "FROM", "MESSAGE")
		for i := range events {
			e := &events[i]
			from := e.ReportingController
			if from == "" {
				from = e.Source.Component
			}
			printRow(tw, "  ", e.Type, e.Reason, age(eventTime(e), now), orDash(from), strings.TrimSpace(e.Message))
		}
	})
	return nil
}

// section writes "Title:  <none>" or a title line and an indented table.
func section(w io.Writer, title string, n int, rows func(*tabwriter.Writer)) {
	if n == 0 {
		_, _ = fmt.Fprintf(w, "%s<none>\n", label(title))
		return
	}
	_, _ = fmt.Fprintf(w, "%s:\n", title)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	rows(tw)
	_ = tw.Flush()
}

// label pads a describe label to the width of the header fields.
func label(title string) string {
	const width = len("Hand-off timeout:  ")
	if len(title)+3 > width {
		return title + ":  "
	}
	return fmt.Sprintf("%-*s", width, title+":")
}

// eventTime is the most recent time an event was seen.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// leaseView is what acquire prints: the holding a caller needs to use and release.
type leaseView struct {
	Namespace    string    `json:"namespace"`
	Name         string    `json:"name"`
	Key          string    `json:"key"`
	Identity     string    `json:"identity"`
	FencingToken int64     `json:"fencingToken"`
	LeaseID      string    `json:"leaseID"`
	RequestID    string    `json:"requestID"`
	ExpiresAt    time.Time `json:"expiresAt"`
	// Session is the session the lock is held in, if any.
	Session string `json:"session,omitempty"`
}

// printLeases writes what acquire took: one object, or a list for several
// locks, as JSON or YAML; a table with a SESSION column when held in one.
func printLeases(w io.Writer, format string, vs []leaseView, now time.Time) error {
	switch {
	case format != "table" && len(vs) == 1:
		return printData(w, format, vs[0])
	case format != "table":
		return printData(w, format, vs)
	}
	inSession := vs[0].Session != ""
	head := []string{"NAME", "TOKEN", "LEASE-ID", "EXPIRES-AT", "EXPIRES-IN"}
	if inSession {
		head = append(head, "SESSION")
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	printRow(tw, "", head...)
	for _, v := range vs {
		row := []string{v.Name, strconv.FormatInt(v.FencingToken, 10), v.LeaseID,
			v.ExpiresAt.UTC().Format(time.RFC3339), duration.HumanDuration(v.ExpiresAt.Sub(now))}
		if inSession {
			row = append(row, v.Session)
		}
		printRow(tw, "", row...)
	}
	return tw.Flush()
}
