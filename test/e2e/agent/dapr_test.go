package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

// daprSDK installs the pinned Dapr JavaScript SDK (test/e2e/agent/daprjs:
// package.json and its package-lock.json) with `npm ci` into the
// repository's git-ignored .kubelock/npm/, once per lockfile: a later run
// finds it there and needs no network (npm's own cache in $HOME serves a
// reinstall too). It returns the folder to run lock.js in.
func daprSDK() string {
	requireTool("node", "the Dapr SDK test runs Dapr's JavaScript SDK")
	requireTool("npm", "the Dapr SDK test installs Dapr's JavaScript SDK")
	src := repoFile("test", "e2e", "agent", "daprjs")
	lockfile, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	Expect(err).NotTo(HaveOccurred())
	sum := sha256.Sum256(lockfile)
	dir := repoFile(".kubelock", "npm", "daprjs-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@dapr", "dapr", "package.json")); errors.Is(err, os.ErrNotExist) {
		tmp, err := os.MkdirTemp(filepath.Dir(dir), "installing-")
		if errors.Is(err, os.ErrNotExist) {
			Expect(os.MkdirAll(filepath.Dir(dir), 0o755)).To(Succeed())
			tmp, err = os.MkdirTemp(filepath.Dir(dir), "installing-")
		}
		Expect(err).NotTo(HaveOccurred())
		for _, f := range []string{"package.json", "package-lock.json"} {
			copyFile(filepath.Join(src, f), filepath.Join(tmp, f))
		}
		// --ignore-scripts: the SDK needs none of its dependencies' install scripts.
		npm := exec.Command("npm", "ci", "--ignore-scripts", "--prefer-offline", "--no-audit", "--no-fund")
		npm.Dir = tmp
		out, err := npm.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "npm ci in %s: %s", tmp, out)
		if err := os.Rename(tmp, dir); err != nil { // another run installed it first
			Expect(os.RemoveAll(tmp)).To(Succeed())
		}
	}
	copyFile(filepath.Join(src, "lock.js"), filepath.Join(dir, "lock.js"))
	return dir
}

func copyFile(from, to string) {
	data, err := os.ReadFile(from)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(to, data, 0o644)).To(Succeed())
}

// daprStep is one line lock.js prints: a step and the SDK's answer.
type daprStep struct {
	Step         string `json:"step"`
	Healthy      bool   `json:"healthy"`
	Success      *bool  `json:"success"`
	Status       *int   `json:"status"`
	Tries        int    `json:"tries"`
	WaitedMs     int    `json:"waitedMs"`
	Thrown       bool   `json:"thrown"`
	FencingToken *int64 `json:"fencingToken"`
	Error        struct {
		Status   int    `json:"status"`
		ErrorMsg string `json:"error_msg"`
	} `json:"error"`
}

var _ = Describe("kubelock agent's Dapr lock API", func() {
	var ns string
	BeforeEach(func(ctx SpecContext) {
		ns = suite.Namespace(ctx)
		dumpOnFailure(context.Background(), ns)
	})

	It("is what Dapr's JavaScript SDK expects: lock, a second owner refused, unlock by the wrong owner (2), unlock (0), expiry", func(ctx SpecContext) {
		dir := daprSDK()
		a := startAgent(ctx, ns)
		port := a.url[len("http://127.0.0.1:"):]
		node := exec.Command("node", "lock.js")
		node.Dir = dir
		node.Env = append(os.Environ(), "DAPR_HTTP_PORT="+port, "STORE=lockstore", "RESOURCE=orders/42")
		var stderr bytes.Buffer
		node.Stderr = &stderr
		out, err := node.Output()
		GinkgoWriter.Printf("lock.js:\n%s%s", out, stderr.String())
		Expect(err).NotTo(HaveOccurred(), "lock.js: %s", stderr.String())

		steps := map[string]daprStep{}
		for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
			var s daprStep
			Expect(json.Unmarshal(line, &s)).To(Succeed(), "%s", line)
			steps[s.Step] = s
		}
		success := func(step string) bool {
			Expect(steps).To(HaveKey(step))
			Expect(steps[step].Success).NotTo(BeNil(), step)
			return *steps[step].Success
		}
		status := func(step string) int {
			Expect(steps).To(HaveKey(step))
			Expect(steps[step].Status).NotTo(BeNil(), step)
			return *steps[step].Status
		}
		Expect(steps["healthy"].Healthy).To(BeTrue())
		Expect(success("lock")).To(BeTrue())
		Expect(success("lock-other-owner")).To(BeFalse())
		Expect(success("lock-same-owner")).To(BeFalse(), "Dapr's locks are not reentrant")
		Expect(status("unlock-wrong-owner")).To(Equal(2), "LockBelongsToOthers")
		Expect(status("unlock")).To(Equal(0), "Success")
		Expect(status("unlock-again")).To(Equal(1), "LockDoesNotExist")
		Expect(success("lock-expiring")).To(BeTrue())
		Expect(success("lock-before-expiry")).To(BeFalse())
		Expect(success("lock-after-expiry")).To(BeTrue(), "owner-a's lock expired after expiryInSeconds")
		Expect(steps["lock-after-expiry"].Tries).To(BeNumerically(">", 1))
		Expect(status("unlock-expired")).To(Equal(2), "owner-b holds it now")
		Expect(status("unlock-after-expiry")).To(Equal(0))
		Expect(steps["unknown-store"].Thrown).To(BeTrue())
		Expect(steps["unknown-store"].Error.Status).To(Equal(http.StatusBadRequest))
		Expect(steps["unknown-store"].Error.ErrorMsg).To(ContainSubstring("ERR_LOCK_STORE_NOT_FOUND"))
		GinkgoWriter.Printf("owner-b took the lock %d ms after owner-a's 2 s expiry began (%d tries)\n", steps["lock-after-expiry"].WaitedMs, steps["lock-after-expiry"].Tries)

		// The lock saw three holdings, each released by the agent's user:
		// owner-a's, owner-a's that expired, owner-b's.
		name, err := lock.NameForKey("orders/42")
		Expect(err).NotTo(HaveOccurred())
		l := suite.GetLock(ctx, ns, name)
		Expect(l.Status.Holder).To(BeNil())
		Expect(l.Status.Transitions).To(BeEquivalentTo(3))
		for _, f := range l.Status.RecentAcquisitions {
			Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
			Expect(f.EndedBy).To(Equal(a.user))
		}
	})

	It("answers as Dapr's HTTP API does, with the fencing token added to the lock response", func(ctx SpecContext) {
		a := startAgent(ctx, ns, "--dapr-store", "redlock,bluelock")
		lockBody := func(owner string, expiry int) string {
			return fmt.Sprintf(`{"resourceId": "stock/7", "lockOwner": %q, "expiryInSeconds": %d}`, owner, expiry)
		}
		code, body := a.raw(http.MethodPost, "/v1.0-alpha1/lock/redlock", lockBody("app-1", 30))
		Expect(code).To(Equal(http.StatusOK))
		var locked struct {
			Success      bool  `json:"success"`
			FencingToken int64 `json:"fencingToken"`
		}
		Expect(json.Unmarshal([]byte(body), &locked)).To(Succeed())
		Expect(locked.Success).To(BeTrue())
		name, err := lock.NameForKey("stock/7")
		Expect(err).NotTo(HaveOccurred())
		l := suite.GetLock(ctx, ns, name)
		Expect(l.Status.Holder).NotTo(BeNil())
		Expect(locked.FencingToken).To(Equal(l.Status.FencingToken))

		code, body = a.raw(http.MethodPost, "/v1.0-alpha1/lock/bluelock", lockBody("app-2", 30))
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(MatchJSON(`{"success": false}`), "every store is the same locks")

		// Another agent's holding is someone else's too (2), a lock nobody holds is 1.
		other := startAgent(ctx, ns)
		code, body = other.raw(http.MethodPost, "/v1.0-alpha1/unlock/lockstore", `{"resourceId": "stock/7", "lockOwner": "app-1"}`)
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(MatchJSON(`{"status": 2}`))
		code, body = a.raw(http.MethodPost, "/v1.0-alpha1/unlock/redlock", `{"resourceId": "stock/7", "lockOwner": "app-1"}`)
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(MatchJSON(`{"status": 0}`))
		code, body = other.raw(http.MethodPost, "/v1.0-alpha1/unlock/lockstore", `{"resourceId": "nothing", "lockOwner": "app-1"}`)
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(MatchJSON(`{"status": 1}`))

		for req, want := range map[string]string{
			lockBody("app-1", 0): `{"errorCode": "ERR_MALFORMED_REQUEST", "message": "ExpiryInSeconds is not positive in lock store redlock"}`,
			`{"resourceId": "", "lockOwner": "app-1", "expiryInSeconds": 5}`: `{"errorCode": "ERR_MALFORMED_REQUEST", "message": "ResourceId is empty in lock store redlock"}`,
			`{"resourceId": "x", "expiryInSeconds": 5}`:                      `{"errorCode": "ERR_MALFORMED_REQUEST", "message": "LockOwner is empty in lock store redlock"}`,
		} {
			code, body := a.raw(http.MethodPost, "/v1.0-alpha1/lock/redlock", req)
			Expect(code).To(Equal(http.StatusBadRequest), req)
			Expect(body).To(MatchJSON(want), req)
		}
		code, body = a.raw(http.MethodPost, "/v1.0-alpha1/lock/lockstore", lockBody("app-1", 5))
		Expect(code).To(Equal(http.StatusBadRequest))
		Expect(body).To(MatchJSON(`{"errorCode": "ERR_LOCK_STORE_NOT_FOUND", "message": "lock store lockstore not found (this agent serves redlock, bluelock)"}`))
		for _, malformed := range []string{`{"resourceId": `, lockBody("app-1", 5) + ` {"resourceId": "other"}`} {
			code, body = a.raw(http.MethodPost, "/v1.0-alpha1/lock/redlock", malformed)
			Expect(code).To(Equal(http.StatusBadRequest), "%s", malformed)
			Expect(body).To(ContainSubstring(`"errorCode":"ERR_MALFORMED_REQUEST"`), "%s", malformed)
		}
		code, body = a.raw(http.MethodPost, "/v1.0-alpha1/lock/redlock",
			fmt.Sprintf(`{"resourceId": "x", "lockOwner": "app-1", "expiryInSeconds": 5, "pad": %q}`, strings.Repeat("p", 20<<10)))
		Expect(code).To(Equal(http.StatusRequestEntityTooLarge))
		Expect(body).To(MatchJSON(`{"errorCode": "ERR_MALFORMED_REQUEST", "message": "the request body is longer than 16384 bytes"}`))
		err = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "x"}, &locksv1alpha1.DistributedLock{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a refused request creates no lock: %v", err)

		code, body = a.raw(http.MethodGet, "/v1.0/healthz", "")
		Expect(code).To(Equal(http.StatusNoContent))
		Expect(body).To(BeEmpty())
		code, _ = a.raw(http.MethodGet, "/v1.0/healthz/outbound", "")
		Expect(code).To(Equal(http.StatusNoContent))
		code, body = a.raw(http.MethodGet, "/v1.0/metadata", "")
		Expect(code).To(Equal(http.StatusOK))
		var meta struct {
			ID         string `json:"id"`
			Components []struct {
				Name, Type string
			} `json:"components"`
		}
		Expect(json.Unmarshal([]byte(body), &meta)).To(Succeed())
		Expect(meta.ID).To(Equal(a.user))
		Expect(meta.Components).To(HaveLen(2))
		Expect(meta.Components[0].Type).To(Equal("lock.kubelock"))
	})
})
