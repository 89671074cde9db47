package operator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/oauth2"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/transport"

	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/pkg/lock/leaderelection"
)

// The locks the operator's replicas can elect their leader on.
const (
	// ElectOnLease is controller-runtime's coordination.k8s.io Lease.
	ElectOnLease = "lease"
	// ElectOnKubelock is a DistributedLock (pkg/lock/leaderelection).
	ElectOnKubelock = "kubelock"
)

// Admission never lets the controller's own user acquire a lock or join a
// queue ([kubelock:controller-only]): it may expire holdings, and one user
// must not be able to do both. So the replicas campaign as another service
// account, with tokens the manager requests for it. A token can be bound to a
// pod only if the pod runs as that very service account (the apiserver's
// TokenRequest refuses any other), and the replicas' pods run as the
// controller's, so the election's tokens are bound to nothing: each replica
// is a holder of its own by its identity (POD_NAME) and the leaseID of each
// acquisition, and writes no pod into its holding, since admission accepts a
// pod only from a token bound to it.
//
// +kubebuilder:rbac:groups="",namespace=system,resources=serviceaccounts/token,resourceNames=kubelock-leader-election,verbs=create

// electionTokenTTL is how long a candidate's token is valid: the shortest
// lifetime the apiserver issues, as the token is bound to no pod that could
// end it sooner. It is kept in memory only and replaced after 80% of it.
const electionTokenTTL = 10 * time.Minute

// inClusterNamespace is where a pod's service account namespace is mounted.
const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// kubelockElection builds the resource lock the manager elects on with
// --leader-election-lock=kubelock, and returns the lock's key.
func kubelockElection(cfg *rest.Config, o Options) (resourcelock.Interface, types.NamespacedName, error) {
	ns, err := o.electionNamespace()
	if err != nil {
		return nil, types.NamespacedName{}, err
	}
	key := types.NamespacedName{Namespace: ns, Name: o.LeaderElectionID}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, key, err
	}
	ts := &saTokenSource{cs: cs, namespace: ns, serviceAccount: o.LeaderElectionServiceAccount}
	candidate := rest.AnonymousClientConfig(cfg)
	candidate.WrapTransport = transport.TokenSourceWrapTransport(transport.NewCachedTokenSource(ts))
	candidate.UserAgent = "kubelock-manager/leader-election"
	lo := o.electionTimings()
	lo.OnCampaign = reportCampaign
	rl, err := leaderelection.New(candidate, o.LeaderElectionID, lo,
		lock.WithNamespace(ns), lock.WithIdentity(electionIdentity()), lock.WithAutoCreate())
	if err != nil {
		return nil, key, err
	}
	return rl, key, nil
}

// reportCampaign keeps kubelock_manager_leader_election_campaign_failing: a
// replica whose attempts fail is no standby, though it logs no differently.
func reportCampaign(err error) {
	failing := 0.0
	if err != nil {
		failing = 1
	}
	metrics.LeaderElectionCampaignFailing.Set(failing)
}

func (o *Options) electionTimings() leaderelection.Options {
	return leaderelection.Options{LeaseDuration: o.LeaseDuration, RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod}
}

// electionNamespace is --leader-election-namespace, else the pod's own.
func (o *Options) electionNamespace() (string, error) {
	if o.LeaderElectionNamespace != "" {
		return o.LeaderElectionNamespace, nil
	}
	b, err := os.ReadFile(inClusterNamespace)
	if err != nil {
		return "", fmt.Errorf("--leader-election-namespace is required out of cluster: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// electionIdentity names this replica in the election: its pod, else the
// host plus a random suffix (as controller-runtime's Lease election does), so
// two processes on one host differ.
func electionIdentity() string {
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return pod
	}
	host, _ := os.Hostname()
	return host + "_" + string(uuid.NewUUID())
}

// saTokenSource requests tokens for the election's service account.
type saTokenSource struct {
	cs             kubernetes.Interface
	namespace      string
	serviceAccount string
}

// Token implements oauth2.TokenSource.
func (s *saTokenSource) Token() (*oauth2.Token, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ttl := int64(electionTokenTTL / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}
	issued := time.Now()
	out, err := s.cs.CoreV1().ServiceAccounts(s.namespace).CreateToken(ctx, s.serviceAccount, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("requesting a token for service account %s/%s (--leader-election-service-account): %w", s.namespace, s.serviceAccount, err)
	}
	if out.Status.Token == "" {
		return nil, errors.New("the token request returned no token")
	}
	// Replace it well before it expires, whatever the apiserver granted.
	lifetime := out.Status.ExpirationTimestamp.Sub(issued)
	return &oauth2.Token{AccessToken: out.Status.Token, Expiry: issued.Add(lifetime * 8 / 10)}, nil
}
