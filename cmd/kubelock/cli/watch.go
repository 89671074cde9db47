package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// watchFlags are get's and list's -w/--watch and --output-watch-events.
type watchFlags struct{ watch, events bool }

func (f *watchFlags) add(flags *pflag.FlagSet) {
	flags.BoolVarP(&f.watch, "watch", "w", false, "after printing the locks, watch them: one more line per change, until Ctrl-C")
	flags.BoolVar(&f.events, "output-watch-events", false, "with --watch, say what each line is: ADDED, MODIFIED or DELETED")
}

// watchLocks prints the locks named by keys (all in the namespace without
// keys; in every namespace with all) as get and list do, then one line per
// change, as kubectl get -w does, until ctx ends or SIGINT/SIGTERM (a clean
// exit). The watch resumes by itself when the apiserver ends it or the
// connection breaks, and lists again when its resourceVersion is too old
// (client-go's informer, through watchtools.UntilWithSync); a change already
// printed is not printed again.
func (o *options) watchLocks(ctx context.Context, keys []string, all, events bool) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, ns, err := o.connect()
	if err != nil {
		return err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return errorf("building a client: %w", err)
	}
	p := &lockWatchPrinter{o: o, all: all, events: events, names: map[string]bool{}, seen: map[string]string{}}
	for _, k := range keys {
		name, err := lock.NameForKey(k)
		if err != nil {
			return withCode(ExitUsage, err)
		}
		p.names[name] = true
	}
	listOpts := client.ListOptions{}
	if !all {
		listOpts.Namespace = ns
	}
	if len(keys) == 1 {
		listOpts.FieldSelector = fields.OneTermEqualSelector("metadata.name", onlyKey(p.names))
	}

	// The first list shows what there is (and any error) at once; the
	// informer lists again, and what changed in between prints as a change.
	list := &locksv1alpha1.DistributedLockList{}
	if err := c.List(ctx, list, &listOpts); err != nil {
		return errorf("listing locks: %w", err)
	}
	if err := p.initial(list.Items, keys, ns); err != nil {
		return err
	}
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, raw metav1.ListOptions) (runtime.Object, error) {
			l := &locksv1alpha1.DistributedLockList{}
			opts := listOpts
			opts.Raw = &raw
			return l, c.List(ctx, l, &opts)
		},
		WatchFuncWithContext: func(ctx context.Context, raw metav1.ListOptions) (watch.Interface, error) {
			opts := listOpts
			opts.Raw = &raw
			return c.Watch(ctx, &locksv1alpha1.DistributedLockList{}, &opts)
		},
	}
	_, err = watchtools.UntilWithSync(ctx, lw, &locksv1alpha1.DistributedLock{}, nil, p.changed)
	if ctx.Err() != nil {
		return nil // Ctrl-C, SIGTERM or the caller's cancel: a clean exit
	}
	if err != nil {
		return errorf("watching locks: %w", err)
	}
	return nil
}

func onlyKey(names map[string]bool) string {
	for n := range names {
		return n
	}
	return ""
}

// lockWatchPrinter prints the first state and then each change once.
type lockWatchPrinter struct {
	o           *options
	all, events bool
	// names are the lock names asked for; empty means every lock.
	names map[string]bool
	// seen is the resourceVersion last printed per namespace/name.
	seen  map[string]string
	table lockTable
	cols  columns
	// headed is set once the table's header is out.
	headed bool
}

// initial prints the locks as get or list would; keys that name no lock
// fail as get fails.
func (p *lockWatchPrinter) initial(items []locksv1alpha1.DistributedLock, keys []string, ns string) error {
	var locks []locksv1alpha1.DistributedLock
	for i := range items {
		if p.wanted(&items[i]) {
			locks = append(locks, items[i])
		}
	}
	sort.Slice(locks, func(i, j int) bool {
		if locks[i].Namespace != locks[j].Namespace {
			return locks[i].Namespace < locks[j].Namespace
		}
		return locks[i].Name < locks[j].Name
	})
	for _, k := range keys {
		name, _ := lock.NameForKey(k)
		if !slices.ContainsFunc(locks, func(l locksv1alpha1.DistributedLock) bool { return l.Name == name }) {
			return notFound(lock.ErrNotFound, ns, k, false)
		}
	}
	p.table = newLockTable(locks, p.all)
	p.cols.w = p.o.streams.Out
	if p.events {
		p.cols.fit([]string{string(watch.Modified)}) // the widest event: rows stay aligned
	}
	if p.o.output == "table" {
		if len(locks) == 0 {
			p.o.noneFound("locks", ns, p.all)
			return nil
		}
		rows := [][]string{p.header()}
		for i := range locks {
			rows = append(rows, p.row(watch.Added, &locks[i]))
		}
		p.cols.fit(rows...)
		for _, r := range rows {
			p.cols.print(r)
		}
		p.headed = true
	}
	for i := range locks {
		l := &locks[i]
		p.seen[l.Namespace+"/"+l.Name] = l.ResourceVersion
		if p.o.output != "table" {
			if err := p.printData(watch.Added, l); err != nil {
				return err
			}
		}
	}
	return nil
}

// changed is the watch's condition: it prints ev if it changes what was
// printed, and never ends the watch.
func (p *lockWatchPrinter) changed(ev watch.Event) (bool, error) {
	l, ok := ev.Object.(*locksv1alpha1.DistributedLock)
	if !ok || !p.wanted(l) {
		return false, nil
	}
	key := l.Namespace + "/" + l.Name
	if ev.Type == watch.Deleted {
		delete(p.seen, key)
	} else {
		if p.seen[key] == l.ResourceVersion {
			return false, nil // printed already (the informer's own list, or a relist)
		}
		p.seen[key] = l.ResourceVersion
	}
	if p.o.output != "table" {
		return false, p.printData(ev.Type, l)
	}
	row := p.row(ev.Type, l)
	if !p.headed {
		p.cols.fit(p.header())
		p.cols.print(p.header())
		p.headed = true
	}
	p.cols.fit(row)
	p.cols.print(row)
	return false, nil
}

func (p *lockWatchPrinter) wanted(l *locksv1alpha1.DistributedLock) bool {
	return len(p.names) == 0 || p.names[l.Name]
}

func (p *lockWatchPrinter) header() []string {
	if p.events {
		return append([]string{"EVENT"}, p.table.header()...)
	}
	return p.table.header()
}

func (p *lockWatchPrinter) row(t watch.EventType, l *locksv1alpha1.DistributedLock) []string {
	row := p.table.row(l, p.o.now())
	if p.events {
		return append([]string{string(t)}, row...)
	}
	return row
}

// printData writes l as JSON or YAML; with events, inside a watch event as
// kubectl's --output-watch-events does.
func (p *lockWatchPrinter) printData(t watch.EventType, l *locksv1alpha1.DistributedLock) error {
	obj := withKind(*l)
	if !p.events {
		return printData(p.o.streams.Out, p.o.output, obj)
	}
	return printData(p.o.streams.Out, p.o.output, struct {
		Type   watch.EventType               `json:"type"`
		Object locksv1alpha1.DistributedLock `json:"object"`
	}{t, obj})
}

// columns prints rows aligned as a tabwriter would (three spaces between
// columns), keeping the widths of the rows before: a watch prints one row at
// a time.
type columns struct {
	w      io.Writer
	widths []int
}

// fit widens the columns for rows.
func (c *columns) fit(rows ...[]string) {
	for _, r := range rows {
		for i, cell := range r {
			if i >= len(c.widths) {
				c.widths = append(c.widths, 0)
			}
			c.widths[i] = max(c.widths[i], utf8.RuneCountInString(shown(cell)))
		}
	}
}

// print writes one row, its control characters escaped.
func (c *columns) print(cells []string) {
	var b strings.Builder
	for i, cell := range cells {
		cell = shown(cell)
		b.WriteString(cell)
		if i < len(cells)-1 {
			b.WriteString(strings.Repeat(" ", c.widths[i]-utf8.RuneCountInString(cell)+3))
		}
	}
	b.WriteByte('\n')
	_, _ = io.WriteString(c.w, b.String())
}
