package lockapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestDirectClientsAreQueuedFairlyPerUser: kubelock-apiserver follows the
// cluster's priority and fairness, so a user who floods it straight (not
// through kube-apiserver, whose own priority and fairness would stop the
// flood there) fills only their own queues. A priority level of 3 seats
// that borrows none, queued per user: mallory sends bursts of 150
// concurrent requests and is refused with 429 once her queues are full,
// while every one of alice's requests in the meantime is served.
func TestDirectClientsAreQueuedFairlyPerUser(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	if err := env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared"}}); err != nil {
		t.Fatal(err)
	}
	level := &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "lockapi-fairness-" + ns},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](1), BorrowingLimitPercent: ptr.To[int32](0), LendablePercent: ptr.To[int32](0),
				LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeQueue,
					Queuing: &flowcontrolv1.QueuingConfiguration{Queues: 64, HandSize: 6, QueueLengthLimit: 5}},
			}},
	}
	schema := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "lockapi-fairness-" + ns},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: level.Name},
			MatchingPrecedence:         100,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{
					{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "alice"}},
					{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "mallory"}},
				},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{locksv1alpha1.GroupVersion.Group},
					Resources: []string{"distributedlocks"}, Namespaces: []string{ns}}},
			}},
		},
	}
	for _, o := range []client.Object{level, schema} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(ctx), o) })
	}

	get := func(ctx context.Context, c *http.Client, cfg *rest.Config) (int, http.Header, error) {
		url := fmt.Sprintf("%s/apis/%s/namespaces/%s/distributedlocks/shared", cfg.Host, locksv1alpha1.GroupVersion, ns)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, nil, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header, nil
	}
	// Raw HTTP: client-go would retry a 429 after its Retry-After.
	direct := func(user string) (*http.Client, *rest.Config) {
		cfg, err := env.UserConfig(ctx, user)
		if err != nil {
			t.Fatal(err)
		}
		cfg = server.Direct(cfg)
		c, err := rest.HTTPClientFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c, cfg
	}
	alice, aliceCfg := direct("alice")
	mallory, malloryCfg := direct("mallory")

	// kubelock-apiserver has read the new configuration once it classifies
	// alice's requests into the new level (its UID in the answer's header).
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, h, err := get(ctx, alice, aliceCfg)
		return err == nil && code == http.StatusOK && h.Get("X-Kubernetes-PF-PriorityLevel-UID") == string(level.UID), nil
	}); err != nil {
		t.Fatalf("kubelock-apiserver does not classify alice's requests into priority level %s (UID %s): %v", level.Name, level.UID, err)
	}

	var (
		mu       sync.Mutex
		codes    = map[string]map[int]int{"alice": {}, "mallory": {}}
		failures []error
	)
	count := func(user string, code int, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failures = append(failures, fmt.Errorf("%s: %w", user, err))
			return
		}
		codes[user][code]++
	}
	flood, stop := context.WithCancel(ctx)
	refused := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Go(func() {
		for flood.Err() == nil {
			var burst sync.WaitGroup
			for range 150 {
				burst.Go(func() {
					code, _, err := get(flood, mallory, malloryCfg)
					if flood.Err() != nil {
						return // stopped, not answered
					}
					if code == http.StatusTooManyRequests {
						once.Do(func() { close(refused) })
					}
					count("mallory", code, err)
				})
			}
			burst.Wait()
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })
	// alice's requests, one at a time, once mallory's bursts are refused
	// and while they go on.
	select {
	case <-refused:
	case <-time.After(time.Minute):
		t.Fatal("mallory's bursts were not refused within a minute: the priority level does not bound her")
	}
	for range 40 {
		code, _, err := get(ctx, alice, aliceCfg)
		count("alice", code, err)
		time.Sleep(25 * time.Millisecond) // her pace, not synchronisation
	}
	stop()
	wg.Wait()
	t.Logf("answers by status: alice %v, mallory %v", codes["alice"], codes["mallory"])
	for _, err := range failures {
		t.Error(err)
	}
	if codes["mallory"][http.StatusTooManyRequests] == 0 {
		t.Errorf("mallory's bursts of 150 were never refused (answers %v): the priority level did not bound her", codes["mallory"])
	}
	if codes["alice"][http.StatusOK] != 40 {
		t.Errorf("alice's 40 requests during mallory's bursts were answered %v, want 40 × 200: one user's flood refused another's requests", codes["alice"])
	}
}
