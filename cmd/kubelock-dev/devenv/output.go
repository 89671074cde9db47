package devenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/locallockapi"
)

// AdminContext is the kubeconfig's current context; each user in LockUsers
// and BreakglassUser has a context of the same name.
const AdminContext = "kubelock-dev"

// writeKubeconfig writes the admin kubeconfig with a context per user, and
// links kubectl and kubectl-lock into Dir/bin for the PATH of the next steps.
func (e *env) writeKubeconfig() error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[AdminContext] = &clientcmdapi.Cluster{Server: e.admin.Host, CertificateAuthorityData: e.cluster.CA.PEM}
	add := func(ctxName, user string, crt, key []byte) {
		kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
		kc.Contexts[ctxName] = &clientcmdapi.Context{Cluster: AdminContext, AuthInfo: user, Namespace: "default"}
	}
	add(AdminContext, AdminUser, e.admin.CertData, e.admin.KeyData)
	for _, u := range append(append([]string(nil), LockUsers...), BreakglassUser) {
		crt, key, err := e.cluster.CA.Client(u)
		if err != nil {
			return err
		}
		add(u, u, crt, key)
	}
	kc.CurrentContext = AdminContext
	if err := os.MkdirAll(filepath.Dir(e.o.KubeconfigOut), 0o700); err != nil {
		return err
	}
	if err := clientcmd.WriteToFile(*kc, e.o.KubeconfigOut); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	if err := os.Chmod(e.o.KubeconfigOut, 0o600); err != nil {
		return err
	}

	for link, target := range map[string]string{
		"kubectl":      filepath.Join(e.o.AssetsDir, "kubectl"),
		"kubectl-lock": e.kubelock,
	} {
		p := filepath.Join(e.binDir, link)
		_ = os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			return fmt.Errorf("linking %s: %w", p, err)
		}
	}
	return nil
}

// NextSteps are the commands printed after the ready line, in order, with
// their comments. Commands that need a value from an earlier one's output
// name it in angle brackets.
func NextSteps(kubeconfig, binDir string) [][2]string {
	return [][2]string{
		{"export KUBECONFIG=" + shellQuote(kubeconfig), ""},
		{"export PATH=" + shellQuote(binDir) + ":$PATH", "kubectl and the kubectl-lock plugin"},
		{"kubectl apply -k config/samples/", "from the repository root: sample locks (a Mutex, an RWMutex, a Semaphore), lock-user RBAC, Jobs, Deployments (a sidecar's, an agent's)"},
		{"kubectl get dlock", "the locks: demo (created for you) and the samples"},
		{"kubectl lock acquire demo", "as the admin: prints the FENCING TOKEN and LEASE-ID"},
		{"kubectl lock release demo --lease-id <LEASE-ID>", "only the holder may release"},
		{"kubectl --context alice get dlock demo", "alice and bob are lock users"},
		{"kubectl lock acquire demo --lease 5m --context bob", "bob holds demo (plugin flags go after the plugin name)"},
		{"kubectl lock release demo --lease-id <bob's LEASE-ID> --context alice", "denied: [kubelock:holder-only]"},
		{"kubectl lock force-release demo --reason trying-break-glass --context carol", "carol has the force-release verb"},
		{"kubectl lock describe demo", "history, conditions and events"},
		{"kubectl lock acquire stock-1 stock-2 stock-3 --create --session-ttl 5m --context alice", "three locks in one session: one renewal for all (none once acquire exits: it lapses in 5m)"},
		{"kubectl lock sessions", "alice's session holds 3 locks (LOCKS, counted by the controller)"},
		{"kubectl lock force-release --session <SESSION> --context carol", "ends the session and the three locks held in it (SessionClosed)"},
	}
}

func (e *env) printNextSteps() error {
	o := &e.o
	var b strings.Builder
	fmt.Fprintln(&b, ReadyLine)
	tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	if c := e.cluster; c.Balancer != nil {
		var as []string
		for _, a := range c.APIServers {
			as = append(as, a.Name+" "+a.URL)
		}
		fmt.Fprintf(tw, "  apiserver\t%s: HAProxy in front of %s (etcd members on %s)\n", e.admin.Host, strings.Join(as, ", "), strings.Join(c.Etcd.Endpoints(), ", "))
	} else {
		fmt.Fprintf(tw, "  apiserver\t%s (etcd on 127.0.0.1:%d)\n", e.admin.Host, o.EtcdPort)
	}
	persist := "fresh at every start; --persist keeps it"
	if o.Persist {
		persist = "kept across restarts (--persist)"
	}
	fmt.Fprintf(tw, "  data\t%s (%s); logs in %s\n", o.Dir, persist, e.logDir)
	if o.Node {
		fmt.Fprintf(tw, "  node\t%s: kubelet, containerd, kube-proxy, kube-scheduler; images %s and %s built from the checkout (imagePullPolicy: Never)\n", e.node.IP, ManagerImage, KubelockImage)
		fmt.Fprintf(tw, "  operator\tDeployment %s/%s from config/default (2 replicas, leader election), webhook behind Service %s/kubelock-webhook-service\n", OperatorNamespace, OperatorDeployment, OperatorNamespace)
	} else {
		fmt.Fprintf(tw, "  operator\tcontroller + webhook in this process (https://127.0.0.1:%d)\n", o.WebhookPort)
	}
	if e.lockAPI != nil {
		fmt.Fprintf(tw, "  backend\tapiserver: kubelock-apiserver on %s (etcd on %s) behind APIService %s; no lock CRDs (--backend)\n",
			e.lockAPI.URL(), strings.Join(e.lockAPI.Etcd.Endpoints(), ", "), locallockapi.APIServiceName)
		fmt.Fprintf(tw, "  admission\tin kubelock-apiserver: its stores run the lock rules; no webhook or policy sees lock writes\n")
	} else {
		fmt.Fprintf(tw, "  backend\tcrd: the lock CRDs in kube-apiserver (--backend apiserver: kubelock-apiserver and an etcd of its own)\n")
	}
	switch {
	case e.lockAPI != nil:
	case o.Admission == AdmissionPolicy:
		fmt.Fprintf(tw, "  admission\tpolicy: config/policy's ValidatingAdmissionPolicies in kube-apiserver; no webhook sees lock writes (--admission)\n")
	default:
		fmt.Fprintf(tw, "  admission\twebhook: the operator's validating webhook (--admission policy: the ValidatingAdmissionPolicies instead)\n")
	}
	fmt.Fprintf(tw, "  fenced objects\tConfigMaps labelled %s=true: every write needs the current token of the lock named by %s, from its holder (config/samples/fenced_configmap.yaml)\n",
		locksv1alpha1.FencedLabel, locksv1alpha1.FencedByAnnotation)
	fmt.Fprintf(tw, "  kubeconfig\t%s: contexts %s (admin, current), %s (lock users), %s (lock user + break-glass)\n",
		o.KubeconfigOut, AdminContext, strings.Join(LockUsers, ", "), BreakglassUser)
	_ = tw.Flush()
	fmt.Fprintf(&b, "\nNext steps, in a second shell (Ctrl-C here stops everything):\n")
	tw = tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	for _, s := range NextSteps(o.KubeconfigOut, e.binDir) {
		if s[1] == "" {
			fmt.Fprintf(tw, "  %s\n", s[0])
			continue
		}
		fmt.Fprintf(tw, "  %s\t# %s\n", s[0], s[1])
	}
	_ = tw.Flush()
	_, err := fmt.Fprint(o.Out, b.String())
	return err
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r == ':' || r == '+' || r == ',' || r == '=' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
