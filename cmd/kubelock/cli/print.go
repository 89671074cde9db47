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
	"github.com/kubelock/kubelock/pkg/lock"
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

// lockKey is the business key of a lock: its annotation when that key's
// name is the lock's, else its name (lock.KeyOf).
func lockKey(l *locksv1alpha1.DistributedLock) string { return lock.KeyOf(l) }

// leaseEnd is when the holder's lease runs out by its own renewTime; informational.
func leaseEnd(h *locksv1alpha1.LockHolder) time.Time {
	from := h.AcquireTime.Time
	if h.RenewTime != nil {
		from = h.RenewTime.Time
	}
	return from.Add(time.Duration(h.LeaseDurationSeconds) * time.Second)
}

// holdings are the lock's holdings: the exclusive holder, then the shared
// holders in slot order.
func holdings(l *locksv1alpha1.DistributedLock) []*locksv1alpha1.LockHolder {
	var out []*locksv1alpha1.LockHolder
	if h := l.Status.Holder; h != nil {
		out = append(out, h)
	}
	for _, s := range sharedBySlot(l) {
		out = append(out, &s.LockHolder)
	}
	return out
}

// sharedBySlot is status.sharedHolders sorted by slot (writers append; a
// person reads permits in order).
func sharedBySlot(l *locksv1alpha1.DistributedLock) []locksv1alpha1.SharedHolder {
	s := slices.Clone(l.Status.SharedHolders)
	slices.SortFunc(s, func(a, b locksv1alpha1.SharedHolder) int { return int(a.Slot) - int(b.Slot) })
	return s
}

// expiresIn is the time left on the lease that runs out first, "-" when free,
// "session" when every holding lives as long as its session, and "overdue Ns"
// when a holding's last renewal is older than its lease (the controller
// expires it shortly).
func expiresIn(l *locksv1alpha1.DistributedLock, now time.Time) string {
	hs := holdings(l)
	if len(hs) == 0 {
		return "-"
	}
	var soonest time.Time
	for _, h := range hs {
		if e := leaseEnd(h); h.Session == "" && (soonest.IsZero() || e.Before(soonest)) {
			soonest = e
		}
	}
	if soonest.IsZero() {
		return "session"
	}
	return timeLeft(soonest, now)
}

// holdingExpires is expiresIn for one holding.
func holdingExpires(h *locksv1alpha1.LockHolder, now time.Time) string {
	if h.Session != "" {
		return "session"
	}
	return timeLeft(leaseEnd(h), now)
}

func timeLeft(end, now time.Time) string {
	left := end.Sub(now)
	if left < 0 {
		return "overdue " + duration.HumanDuration(-left)
	}
	return duration.HumanDuration(left)
}

// holdersCount is the HOLDERS column: the number of holdings, "of permits"
// for a Semaphore (2/3).
func holdersCount(l *locksv1alpha1.DistributedLock) string {
	n := strconv.Itoa(len(holdings(l)))
	if l.LockType() == locksv1alpha1.Semaphore {
		return n + "/" + strconv.Itoa(l.SharedLimit())
	}
	return n
}

// maxHolderNames is how many identities the HOLDER column shows.
const maxHolderNames = 2

// holderNames is the HOLDER column: the holders' identities, the first
// maxHolderNames and how many more (as kubectl prints ports), or <free>.
func holderNames(l *locksv1alpha1.DistributedLock) string {
	hs := holdings(l)
	if len(hs) == 0 {
		return "<free>"
	}
	var names []string
	for _, h := range hs[:min(len(hs), maxHolderNames)] {
		names = append(names, h.Identity)
	}
	s := strings.Join(names, ",")
	if more := len(hs) - maxHolderNames; more > 0 {
		s += fmt.Sprintf(" + %d more", more)
	}
	return s
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
	return append(head, "TYPE", "HOLDERS", "HOLDER", "TOKEN", "EXPIRES-IN", "WAITERS", "AGE")
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
	return append(row, string(l.LockType()), holdersCount(l), holderNames(l), strconv.FormatInt(l.Status.FencingToken, 10), expiresIn(l, now),
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

// describeLock writes the describe view: spec, holders, queue with positions,
// recent acquisitions, conditions and events.
func describeLock(w io.Writer, l *locksv1alpha1.DistributedLock, d lockDetails, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	p := func(format string, args ...any) { printf(tw, format+"\n", args...) }
	p("Name:\t%s", l.Name)
	p("Namespace:\t%s", l.Namespace)
	p("Key:\t%s", lockKey(l))
	p("Type:\t%s", typeLine(l))
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
	if l.LockType() == locksv1alpha1.Mutex {
		p("Fencing token:\t%d", l.Status.FencingToken)
	} else {
		p("Fencing token:\t%d (the latest issued; each holding has its own)", l.Status.FencingToken)
	}
	p("Transitions:\t%d", l.Status.Transitions)
	if l.LockType() != locksv1alpha1.Semaphore {
		describeHolder(p, l, d, now)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l.LockType() != locksv1alpha1.Mutex || len(l.Status.SharedHolders) > 0 {
		describeShared(w, l, now)
	}
	describeQueue(w, l, now)
	describeHistory(w, l, now)
	section(w, "Conditions", len(l.Status.Conditions), func(tw *tabwriter.Writer) {
		printRow(tw, "  ", "TYPE", "STATUS", "REASON", "SINCE", "MESSAGE")
		for _, c := range l.Status.Conditions {
			printRow(tw, "  ", c.Type, string(c.Status), c.Reason,
				duration.HumanDuration(now.Sub(c.LastTransitionTime.Time)), orDash(c.Message))
		}
	})
	describeEvents(w, d, now)
	return nil
}

func secs(s int32) string { return (time.Duration(s) * time.Second).String() }

// typeLine is the lock's type with what it admits: "Semaphore (3 permits)".
func typeLine(l *locksv1alpha1.DistributedLock) string {
	switch l.LockType() {
	case locksv1alpha1.Semaphore:
		return fmt.Sprintf("Semaphore (%d permits)", l.SharedLimit())
	case locksv1alpha1.RWMutex:
		return "RWMutex (one writer or many readers)"
	}
	return "Mutex"
}

// describeHolder writes the exclusive holding: a Mutex's holder, an RWMutex's writer.
func describeHolder(p func(string, ...any), l *locksv1alpha1.DistributedLock, d lockDetails, now time.Time) {
	title := "Holder"
	if l.LockType() == locksv1alpha1.RWMutex {
		title = "Writer"
	}
	h := l.Status.Holder
	if h == nil {
		free := "<free>"
		if l.LockType() == locksv1alpha1.RWMutex {
			free = "<none>"
		}
		p("%s:\t%s", title, free)
		return
	}
	p("%s:", title)
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
		return
	}
	if h.RenewTime != nil {
		p("  Renewed:\t%s", stamp(h.RenewTime.Time, now))
	}
	p("  Expires:\t%s (by the holder's clock)", holdingExpires(h, now))
}

// describeShared writes the shared holdings, one row each in slot order:
// an RWMutex's readers, a Semaphore's permits.
func describeShared(w io.Writer, l *locksv1alpha1.DistributedLock, now time.Time) {
	title := "Readers"
	if l.LockType() == locksv1alpha1.Semaphore {
		title = fmt.Sprintf("Holders (%d of %d permits)", len(l.Status.SharedHolders), l.SharedLimit())
	}
	shared := sharedBySlot(l)
	onPods := slices.ContainsFunc(shared, func(h locksv1alpha1.SharedHolder) bool { return h.PodName != "" })
	section(w, title, len(shared), func(tw *tabwriter.Writer) {
		head := []string{"SLOT", "TOKEN", "IDENTITY", "USER"}
		if onPods {
			head = append(head, "POD")
		}
		head = append(head, "SESSION", "ACQUIRED", "RENEWED", "EXPIRES", "LEASE-ID")
		printRow(tw, "  ", head...)
		for _, h := range shared {
			row := []string{strconv.Itoa(int(h.Slot)), strconv.FormatInt(h.FencingToken, 10), h.Identity, h.User}
			if onPods {
				row = append(row, orDash(h.PodName))
			}
			renewed := "-"
			if h.RenewTime != nil {
				renewed = duration.HumanDuration(now.Sub(h.RenewTime.Time)) + " ago"
			}
			row = append(row, orDash(h.Session), duration.HumanDuration(now.Sub(h.AcquireTime.Time))+" ago", renewed,
				holdingExpires(&h.LockHolder, now), h.LeaseID)
			printRow(tw, "  ", row...)
		}
	})
}

// describeQueue writes the wait queue with positions; MODE for the types
// that have more than one.
func describeQueue(w io.Writer, l *locksv1alpha1.DistributedLock, now time.Time) {
	withMode := l.LockType() != locksv1alpha1.Mutex
	inSessions := slices.ContainsFunc(l.Status.Waiters, func(q locksv1alpha1.Waiter) bool { return q.Session != "" })
	section(w, "Queue", len(l.Status.Waiters), func(tw *tabwriter.Writer) {
		head := []string{"POSITION"}
		if withMode {
			head = append(head, "MODE")
		}
		head = append(head, "IDENTITY", "USER", "WAITING", "GIVES UP", "REQUEST-ID")
		if inSessions {
			head = append(head, "SESSION")
		}
		printRow(tw, "  ", head...)
		for i, q := range l.Status.Waiters {
			row := []string{strconv.Itoa(i + 1)}
			if withMode {
				row = append(row, string(q.ModeOrDefault()))
			}
			row = append(row, q.Identity, q.User,
				duration.HumanDuration(now.Sub(q.EnqueueTime.Time)), until(q.Deadline.Time, now), q.RequestID)
			if inSessions {
				row = append(row, orDash(q.Session))
			}
			printRow(tw, "  ", row...)
		}
	})
}

// describeHistory writes recentAcquisitions, with the SLOT of shared ones.
func describeHistory(w io.Writer, l *locksv1alpha1.DistributedLock, now time.Time) {
	recent := l.Status.RecentAcquisitions
	withSlot := slices.ContainsFunc(recent, func(f locksv1alpha1.FinishedHolding) bool { return f.Slot != nil })
	section(w, "Recent acquisitions (oldest first)", len(recent), func(tw *tabwriter.Writer) {
		head := []string{"TOKEN"}
		if withSlot {
			head = append(head, "SLOT")
		}
		printRow(tw, "  ", append(head, "IDENTITY", "ENDED", "REASON", "BY", "LEASE-ID", "MESSAGE")...)
		for _, f := range recent {
			row := []string{strconv.FormatInt(f.FencingToken, 10)}
			if withSlot {
				slot := "-"
				if f.Slot != nil {
					slot = strconv.Itoa(int(*f.Slot))
				}
				row = append(row, slot)
			}
			printRow(tw, "  ", append(row, f.Identity, duration.HumanDuration(now.Sub(f.EndTime.Time))+" ago",
				string(f.EndReason), f.EndedBy, f.LeaseID, orDash(f.Message))...)
		}
	})
}

// describeEvents writes the events about the lock, oldest first, or why they are missing.
func describeEvents(w io.Writer, d lockDetails, now time.Time) {
	if d.eventsNote != "" {
		printf(w, "%s%s\n", label("Events"), d.eventsNote)
		return
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
	// Slot is the permit of a shared holding (a Semaphore's, an RWMutex reader's).
	Slot *int32 `json:"slot,omitempty"`
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
	shared := slices.ContainsFunc(vs, func(v leaseView) bool { return v.Slot != nil })
	head := []string{"NAME", "TOKEN"}
	if shared {
		head = append(head, "SLOT")
	}
	head = append(head, "LEASE-ID", "EXPIRES-AT", "EXPIRES-IN")
	if inSession {
		head = append(head, "SESSION")
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	printRow(tw, "", head...)
	for _, v := range vs {
		row := []string{v.Name, strconv.FormatInt(v.FencingToken, 10)}
		if shared {
			slot := "-"
			if v.Slot != nil {
				slot = strconv.Itoa(int(*v.Slot))
			}
			row = append(row, slot)
		}
		row = append(row, v.LeaseID, v.ExpiresAt.UTC().Format(time.RFC3339), duration.HumanDuration(v.ExpiresAt.Sub(now)))
		if inSession {
			row = append(row, v.Session)
		}
		printRow(tw, "", row...)
	}
	return tw.Flush()
}
