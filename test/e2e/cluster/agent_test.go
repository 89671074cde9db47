//go:build cluster

package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestAgentSample runs the agent sample (deployment_agent.yaml): two pods,
// each an app taking a lock per work item through the kubelock agent beside
// it and writing fenced rows with the token. The items pass between the
// pods, every row is accepted in turn (tokens only rise per item, one pod per
// token, every holding's steps complete), each agent holds in a session
// bound to its pod, and a deleted pod's agent releases and deletes its
// session on the way out.
func TestAgentSample(t *testing.T) {
	ctx := requireCluster(t)
	db := database(ctx, t)
	if _, err := db.conn.Exec(ctx, `CREATE TABLE work (id bigserial PRIMARY KEY, item text NOT NULL, pod text NOT NULL, token bigint NOT NULL, step int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	d := &appsv1.Deployment{}
	readSample(t, "deployment_agent.yaml", d)
	app := &d.Spec.Template.Spec.Containers[0]
	app.Env = append(app.Env, corev1.EnvVar{Name: "PG_DSN", Value: db.dsn})
	items := strings.Fields(app.Env[slices.IndexFunc(app.Env, func(e corev1.EnvVar) bool { return e.Name == "ITEMS" })].Value)
	started := time.Now()
	if err := c.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, d) })

	// Every item written by both pods: the locks pass between them.
	eventually(ctx, t, 200*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var n int
		err := db.conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT item FROM work GROUP BY item HAVING count(DISTINCT pod) = 2) AS both_pods`).Scan(&n)
		return n == len(items), errors.Join(err, fmt.Errorf("%d of %d items written by both pods", n, len(items)))
	})
	t.Logf("every item written by both pods %s after the Deployment was created", time.Since(started).Round(10*time.Millisecond))
	checkWork(ctx, t, db, 3)

	// Each agent holds in its pod's session; the locks were created on first use.
	pods := workerPods(ctx, t)
	sessions := &locksv1alpha1.LockSessionList{}
	if err := c.List(ctx, sessions, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods {
		if !slices.ContainsFunc(sessions.Items, func(s locksv1alpha1.LockSession) bool {
			return s.Spec.PodName == pod.Name && s.Spec.PodUID == string(pod.UID)
		}) {
			t.Errorf("no session bound to pod %s", pod.Name)
		}
	}
	for _, item := range items {
		l := &locksv1alpha1.DistributedLock{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: item}, l); err != nil {
			t.Fatal(err)
		}
		if l.Labels[locksv1alpha1.AutoCreatedLabel] != "true" {
			t.Errorf("lock %s is not labelled auto-created: %v", item, l.Labels)
		}
	}

	// A deleted pod: the app stops, its agent releases and deletes its session.
	gone := pods[0]
	if err := c.Delete(ctx, &gone); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, 200*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, sessions, client.InNamespace("default")); err != nil {
			return false, err
		}
		left := slices.ContainsFunc(sessions.Items, func(s locksv1alpha1.LockSession) bool { return s.Spec.PodName == gone.Name })
		return !left, fmt.Errorf("the session of %s is still there", gone.Name)
	})
	checkWork(ctx, t, db, 0) // the deleted pod's last holdings stopped part-way
}

// workerPods are the sample's two running pods.
func workerPods(ctx context.Context, t *testing.T) []corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"app": "invoice-workers"}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d pods of invoice-workers, want 2", len(pods.Items))
	}
	return pods.Items
}

// checkWork checks the rows in the order they were written, per item: tokens
// never go down, each token is one pod's, and (steps > 0) every holding but
// the item's last wrote its steps 0..steps-1: none refused, none lost.
func checkWork(ctx context.Context, t *testing.T, db *db, steps int) {
	t.Helper()
	rows, err := db.conn.Query(ctx, `SELECT item, pod, token, step FROM work ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type holding struct {
		pod   string
		steps []int
	}
	byItem := map[string][]int64{}    // tokens in order
	holdings := map[string]*holding{} // by item and token
	last := map[string]int64{}        // item → last token
	for rows.Next() {
		var item, pod string
		var token int64
		var step int
		if err := rows.Scan(&item, &pod, &token, &step); err != nil {
			t.Fatal(err)
		}
		if token < last[item] {
			t.Fatalf("item %s: token %d after %d: two holders wrote at once", item, token, last[item])
		}
		h := holdings[fmt.Sprint(item, token)]
		if h == nil {
			h = &holding{pod: pod}
			holdings[fmt.Sprint(item, token)] = h
			byItem[item] = append(byItem[item], token)
		}
		if h.pod != pod {
			t.Fatalf("item %s: token %d written by %s and %s", item, token, h.pod, pod)
		}
		h.steps = append(h.steps, step)
		last[item] = token
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	full := make([]int, steps)
	for i := range full {
		full[i] = i
	}
	n := 0
	for item, tokens := range byItem {
		for _, token := range tokens[:len(tokens)-1] {
			if h := holdings[fmt.Sprint(item, token)]; steps > 0 && !slices.Equal(h.steps, full) {
				t.Errorf("item %s, token %d (%s): steps %v, want %v", item, token, h.pod, h.steps, full)
			}
		}
		n += len(tokens)
	}
	t.Logf("%d holdings of %d items, each item's writes in turn with rising tokens", n, len(byItem))
}

// deleteAndWait deletes d and waits for its pods to be gone.
func deleteAndWait(t *testing.T, d *appsv1.Deployment) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = c.Delete(ctx, d, client.PropagationPolicy(metav1.DeletePropagationForeground))
	eventually(ctx, t, 200*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		err := c.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels(d.Spec.Selector.MatchLabels))
		return err == nil && len(pods.Items) == 0, errors.Join(err, fmt.Errorf("%d pods left", len(pods.Items)))
	})
}
