// Package cli is the kubelock command line: kubectl-style lock inspection,
// acquire and release, the `run -- CMD` wrapper and the sidecar. Every lock
// operation goes through pkg/lock; this package adds no protocol of its own.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// Version is the CLI's version, set at build time with
// -ldflags "-X github.com/kubelock/kubelock/cmd/kubelock/cli.Version=v0.1.0".
var Version = "dev"

// Main runs the CLI with args (args[0] is the program name) on the process's
// standard streams and returns the exit code. Errors go to stderr as one line.
func Main(args []string) int {
	return Run(context.Background(), args, genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
}

// Run is Main with explicit streams, for tests.
func Run(ctx context.Context, args []string, s genericiooptions.IOStreams) int {
	if len(args) > 1 && args[1] == guardCommand {
		return runGuard(args[2:], s)
	}
	cmd := newRootCommand(s)
	if len(args) > 0 && strings.HasPrefix(filepath.Base(args[0]), "kubectl-") {
		// Started by kubectl as a plugin: help and usage say "kubectl lock".
		cmd.Use = "kubectl-lock"
		cmd.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl lock"}
	}
	if len(args) > 0 {
		args = args[1:]
	}
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") {
		err = withCode(ExitUsage, errorf("%w", err))
	}
	var ee *exitError
	if !errors.As(err, &ee) || ee.err != nil {
		_, _ = fmt.Fprintln(s.ErrOut, oneLine(err))
	}
	return exitCode(err)
}

// options are the flags every command shares.
type options struct {
	streams  genericiooptions.IOStreams
	config   *genericclioptions.ConfigFlags
	output   string
	identity string
	// lockServer and lockServerCA send lock requests straight to a lock
	// apiserver (lock.NewDirect).
	lockServer, lockServerCA string
	// lockServerFound is where --lock-server=auto found the lock server, for
	// the long-running commands to log.
	lockServerFound string
	// now is the clock for relative times in tables (tests fix it).
	now func() time.Time
}

func newRootCommand(s genericiooptions.IOStreams) *cobra.Command {
	o := &options{streams: s, config: genericclioptions.NewConfigFlags(true), now: time.Now}
	root := &cobra.Command{
		Use:   "kubelock",
		Short: "Distributed locks stored as Kubernetes objects (DistributedLock, locks.kubelock.io)",
		Long: `kubelock takes, inspects and releases DistributedLocks (short name dlock).

A lock is named by a KEY: a valid object name is used as it is, any other string
maps to a normalised name plus a short hash (the key is kept in the annotation
locks.kubelock.io/key). Installed as kubectl-lock on PATH it runs as "kubectl lock".

` + exitCodesHelp,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Without a subcommand, print help; cobra reports unknown commands.
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetOut(s.Out)
	root.SetErr(s.ErrOut)
	root.SetIn(s.In)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withCode(ExitUsage, errorf("%w", err)) })
	flags := root.PersistentFlags()
	o.config.AddFlags(flags)
	// client-go logs retries with klog; keep stderr to our one line.
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	flags.StringVar(&o.identity, "identity", "", "holder identity written into the lock (default: $POD_NAME, else the hostname)")
	flags.StringVar(&o.lockServer, "lock-server", "", "URL of kubelock-apiserver (the lock apiserver backend's Service, e.g. https://kubelock-apiserver.kubelock-system.svc) to send acquisitions, renewals and releases to directly rather than through kube-apiserver, with the same credentials; \""+lockServerAuto+"\" finds it, and the CA to trust it with, from the lock API's APIService")
	flags.StringVar(&o.lockServerCA, "lock-server-ca", "", "PEM file of the CA that signed --lock-server's serving certificate (default: the system's roots; with --lock-server="+lockServerAuto+", the APIService's caBundle)")
	root.AddCommand(
		newGetCommand(o), newListCommand(o), newDescribeCommand(o), newCreateCommand(o),
		newAcquireCommand(o), newReleaseCommand(o), newForceReleaseCommand(o),
		newSessionsCommand(o), newRunCommand(o), newSidecarCommand(o), newAgentCommand(o), newProbeCommand(o), newVersionCommand(o),
		newDevCommand(o),
	)
	return root
}

// addOutputFlag adds -o/--output with the formats a command supports: table,
// json, yaml and more.
func (o *options) addOutputFlag(flags *pflag.FlagSet, more ...string) {
	flags.StringVarP(&o.output, "output", "o", "table", "output format: "+orList(slices.Concat(formats, more)))
}

var formats = []string{"table", "json", "yaml"}

// checkOutput checks --output against the formats given to addOutputFlag.
func (o *options) checkOutput(more ...string) error {
	if all := slices.Concat(formats, more); !slices.Contains(all, o.output) {
		return usageErrorf("unknown output format %q: use %s", o.output, orList(all))
	}
	return nil
}

// orList is "a, b or c".
func orList(s []string) string { return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1] }

// connect is the connection from --kubeconfig/--context or the in-cluster
// config, and the namespace: -n, else the kubeconfig context's, else the pod's.
func (o *options) connect() (*rest.Config, string, error) {
	cfg, err := o.config.ToRESTConfig()
	if err == nil {
		cfg.UserAgent = "kubelock/" + Version
		var ns string
		if ns, _, err = o.config.ToRawKubeConfigLoader().Namespace(); err == nil {
			return cfg, ns, nil
		}
	}
	return nil, "", usageErrorf("no usable Kubernetes configuration: %w", err)
}

// lockClient is a pkg/lock client for the namespace and identity of the flags.
func (o *options) lockClient(ctx context.Context, extra ...lock.Option) (*lock.Client, error) {
	cfg, ns, err := o.connect()
	if err != nil {
		return nil, err
	}
	opts := []lock.Option{lock.WithNamespace(ns)}
	if o.identity != "" {
		opts = append(opts, lock.WithIdentity(o.identity))
	}
	opts = append(opts, extra...)
	var c *lock.Client
	switch {
	case o.lockServer == lockServerAuto:
		if o.lockServerCA != "" {
			return nil, usageErrorf("--lock-server-ca is for a --lock-server URL; with --lock-server=%s the CA is the APIService's", lockServerAuto)
		}
		var server *rest.Config
		if server, err = lock.FindServer(ctx, cfg); err != nil {
			return nil, err
		}
		o.lockServerFound = fmt.Sprintf("%s (%s, from the APIService %s)", server.Host, server.ServerName, locksv1alpha1.APIServiceName)
		c, err = lock.NewDirect(cfg, server, opts...)
	case o.lockServer != "":
		c, err = lock.NewDirect(cfg, direct(cfg, o.lockServer, o.lockServerCA), opts...)
	default:
		c, err = lock.New(cfg, opts...)
	}
	if err != nil {
		return nil, withCode(ExitUsage, err)
	}
	return c, nil
}

// lockServerAuto is the --lock-server that lock.FindServer finds.
const lockServerAuto = "auto"

// direct is cfg's user at the lock apiserver at url, whose serving
// certificate ca signed (the system's roots when empty).
func direct(cfg *rest.Config, url, ca string) *rest.Config {
	d := rest.CopyConfig(cfg)
	d.Host, d.APIPath = url, ""
	// The kubeconfig's trust (its CA, or insecure-skip-tls-verify) is
	// kube-apiserver's, never the lock server's.
	d.CAFile, d.CAData, d.ServerName, d.Insecure = ca, nil, "", false
	return d
}

// readClient is a plain client for listing locks, sessions and events, and
// for create (a spec write, no protocol).
func (o *options) readClient() (client.Client, string, error) {
	cfg, ns, err := o.connect()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", errorf("building a client: %w", err)
	}
	return c, ns, nil
}

// checkKey validates a key before anything is sent.
func checkKey(key string) error {
	if _, err := lock.NameForKey(key); err != nil {
		return withCode(ExitUsage, err)
	}
	return nil
}

// checkWait validates --wait against pkg/lock's bound.
func checkWait(d time.Duration) error {
	if d < 0 || d > lock.DefaultWaitTimeout {
		return usageErrorf("--wait %s is outside 0s..%s", d, lock.DefaultWaitTimeout)
	}
	return nil
}

// checkLease validates --lease as pkg/lock and the API will.
func checkLease(d time.Duration) error {
	if d == 0 {
		return nil
	}
	if d < time.Second || d > locksv1alpha1.MaxLeaseDurationSeconds*time.Second || d%time.Second != 0 {
		return usageErrorf("--lease must be whole seconds within 1s..%ds, got %s", locksv1alpha1.MaxLeaseDurationSeconds, d)
	}
	return nil
}

// exactArgs is cobra.ExactArgs with the usage exit code.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("expected %s, got %d argument(s)", what, len(args))
		}
		return nil
	}
}

func newVersionCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the kubelock version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(o.streams.Out, "kubelock %s (locks.kubelock.io/%s)\n", Version, locksv1alpha1.GroupVersion.Version)
			return err
		},
	}
}
