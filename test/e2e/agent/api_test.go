package agent

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	icli "github.com/kubelock/kubelock/cmd/kubelock/cli"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

// path is the agent's path of key's lock: the key is one escaped segment.
func path(key string, action string, query ...string) string {
	p := "/v1/locks/" + url.PathEscape(key) + action
	if len(query) > 0 {
		p += "?" + strings.Join(query, "&")
	}
	return p
}

var _ = Describe("kubelock agent's own API", func() {
	var ns string
	BeforeEach(func(ctx SpecContext) {
		ns = suite.Namespace(ctx)
		dumpOnFailure(context.Background(), ns)
	})

	It("acquires by key with the token the lock issued, refuses a second try with 409, renews, gets, lists and releases", func(ctx SpecContext) {
		a := startAgent(ctx, ns)
		name, err := lock.NameForKey("orders/42")
		Expect(err).NotTo(HaveOccurred())

		code, h := a.call(http.MethodPost, path("orders/42", ""))
		Expect(code).To(Equal(http.StatusOK), h.Error)
		Expect(h.Key).To(Equal("orders/42"))
		Expect(h.Lock).To(Equal(ns + "/" + name))
		Expect(h.Held).To(BeTrue())
		Expect(h.LeaseSeconds).To(BeEquivalentTo(30))
		Expect(h.ExpiresAt).To(BeTemporally(">", time.Now()))
		l := lockNamed(ctx, h.Lock)
		Expect(l.Labels).To(HaveKeyWithValue(locksv1alpha1.AutoCreatedLabel, "true"), "created on first use")
		Expect(l.Status.Holder).NotTo(BeNil())
		Expect(l.Status.Holder.LeaseID).To(Equal(h.LeaseID))
		Expect(l.Status.Holder.User).To(Equal(a.user))
		Expect(l.Status.Holder.Session).To(Equal(h.Session), "held in the agent's session")
		Expect(l.Status.FencingToken).To(Equal(h.FencingToken))

		code, again := a.call(http.MethodPost, path("orders/42", ""))
		Expect(code).To(Equal(http.StatusConflict))
		Expect(again.Reason).To(Equal("locked"))
		Expect(again.Error).To(ContainSubstring("holds or awaits lock " + name))

		code, renewed := a.call(http.MethodPost, path("orders/42", "/renew", "leaseID="+h.LeaseID))
		Expect(code).To(Equal(http.StatusOK), renewed.Error)
		Expect(renewed.ExpiresAt).NotTo(BeTemporally("<", h.ExpiresAt))
		code, got := a.call(http.MethodGet, path("orders/42", "", "leaseID="+h.LeaseID))
		Expect(code).To(Equal(http.StatusOK))
		Expect(got.FencingToken).To(Equal(h.FencingToken))
		code, body := a.raw(http.MethodGet, "/v1/locks", "")
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(ContainSubstring(`"leaseID":"` + h.LeaseID + `"`))

		code, released := a.call(http.MethodDelete, path("orders/42", "", "leaseID="+h.LeaseID))
		Expect(code).To(Equal(http.StatusOK), released.Error)
		Expect(released.Held).To(BeFalse())
		Expect(released.Ended).To(Equal("released"))
		l = lockNamed(ctx, h.Lock)
		Expect(l.Status.Holder).To(BeNil())
		last := l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
		Expect(last.LeaseID).To(Equal(h.LeaseID))
		Expect(last.EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		Expect(last.EndedBy).To(Equal(a.user))

		for _, method := range []string{http.MethodDelete, http.MethodGet} {
			code, gone := a.call(method, path("orders/42", "", "leaseID="+h.LeaseID))
			Expect(code).To(Equal(http.StatusNotFound))
			Expect(gone.Reason).To(Equal("released"))
		}
		code, body = a.raw(http.MethodGet, "/v1/locks", "")
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(MatchJSON(`{"holdings": []}`))
	})

	It("queues waiting calls in the lock's FIFO order, across agents, and answers 409 timeout when a wait runs out", func(ctx SpecContext) {
		first, second, third := startAgent(ctx, ns), startAgent(ctx, ns), startAgent(ctx, ns)
		code, held := first.call(http.MethodPost, path("report", ""))
		Expect(code).To(Equal(http.StatusOK), held.Error)

		waiting := func(a *agentProc) chan answer {
			ch := make(chan answer, 1)
			go func() {
				defer GinkgoRecover()
				code, h := a.call(http.MethodPost, path("report", "", "wait=60s"))
				Expect(code).To(Equal(http.StatusOK), h.Error)
				ch <- h
			}()
			return ch
		}
		waiters := func() int { return len(lockNamed(ctx, held.Lock).Status.Waiters) }
		secondGot := waiting(second)
		Eventually(waiters).Should(Equal(1))
		thirdGot := waiting(third)
		Eventually(waiters).Should(Equal(2))
		Consistently(secondGot, 200*time.Millisecond).ShouldNot(Receive())

		code, _ = first.call(http.MethodDelete, path("report", "", "leaseID="+held.LeaseID))
		Expect(code).To(Equal(http.StatusOK))
		var h2 answer
		Eventually(secondGot).Should(Receive(&h2))
		Expect(h2.FencingToken).To(BeNumerically(">", held.FencingToken))
		Consistently(thirdGot, 200*time.Millisecond).ShouldNot(Receive(), "the third waits behind the second")

		code, _ = second.call(http.MethodDelete, path("report", "", "leaseID="+h2.LeaseID))
		Expect(code).To(Equal(http.StatusOK))
		var h3 answer
		Eventually(thirdGot).Should(Receive(&h3))
		Expect(h3.FencingToken).To(BeNumerically(">", h2.FencingToken))

		code, timedOut := first.call(http.MethodPost, path("report", "", "wait=1s"))
		Expect(code).To(Equal(http.StatusConflict))
		Expect(timedOut.Reason).To(Equal("timeout"))
	})

	It("answers a long poll as soon as the lock is lost, and releases a holding the app did not renew within its lease", func(ctx SpecContext) {
		a := startAgent(ctx, ns)
		code, h := a.call(http.MethodPost, path("invoice-7", "", "lease=60s"))
		Expect(code).To(Equal(http.StatusOK), h.Error)
		ended := make(chan answer, 1)
		go func() {
			defer GinkgoRecover()
			code, got := a.call(http.MethodGet, path("invoice-7", "", "leaseID="+h.LeaseID, "wait=60s"))
			Expect(code).To(Equal(http.StatusNotFound))
			ended <- got
		}()
		Consistently(ended, 200*time.Millisecond).ShouldNot(Receive(), "the long poll waits while the lock is held")
		forceRelease(ctx, ns, "invoice-7")
		var lost answer
		Eventually(ended, 10*time.Second).Should(Receive(&lost))
		Expect(lost.Reason).To(Equal("lost"))
		Expect(lost.Error).To(ContainSubstring("lock lost"))
		Eventually(a.s.Err).Should(gbytes.Say(`lost invoice-7 \(token [0-9]+, lease ` + h.LeaseID + `\)`))

		// Renewed every 250ms for 3s, a lease of 2s lasts; then it lapses.
		code, h = a.call(http.MethodPost, path("invoice-8", "", "lease=2"))
		Expect(code).To(Equal(http.StatusOK), h.Error)
		Expect(h.ExpiresAt).To(BeTemporally("<=", time.Now().Add(2*time.Second)))
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			code, renewed := a.call(http.MethodPost, path("invoice-8", "/renew", "leaseID="+h.LeaseID))
			Expect(code).To(Equal(http.StatusOK), renewed.Error)
		}
		Eventually(func() string {
			_, got := a.call(http.MethodGet, path("invoice-8", "", "leaseID="+h.LeaseID))
			return got.Reason
		}, 10*time.Second).Should(Equal("expired"))
		// The agent says "expired" as soon as it decides to release, so that
		// the app stops at once; the release is written after.
		var l *locksv1alpha1.DistributedLock
		Eventually(func() *locksv1alpha1.LockHolder { l = lockNamed(ctx, h.Lock); return l.Status.Holder }).Should(BeNil())
		last := l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
		Expect(last.LeaseID).To(Equal(h.LeaseID))
		Expect(last.EndReason).To(Equal(locksv1alpha1.EndReasonReleased), "the agent released it")
		code, renewed := a.call(http.MethodPost, path("invoice-8", "/renew", "leaseID="+h.LeaseID))
		Expect(code).To(Equal(http.StatusNotFound))
		Expect(renewed.Reason).To(Equal("expired"))
		Expect(renewed.Error).To(ContainSubstring("not renewed within its lease of 2s"))
	})

	It("holds a Semaphore's permits shared, each with its slot and token, and refuses shared on a Mutex", func(ctx SpecContext) {
		suite.NewLock(ctx, ns, "pool", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: ptr.To[int32](2)})
		a := startAgent(ctx, ns)
		slots, tokens := map[int32]bool{}, map[int64]bool{}
		for range 2 {
			code, h := a.call(http.MethodPost, path("pool", "", "shared=true"))
			Expect(code).To(Equal(http.StatusOK), h.Error)
			Expect(h.Slot).NotTo(BeNil())
			slots[*h.Slot], tokens[h.FencingToken] = true, true
		}
		Expect(slots).To(Equal(map[int32]bool{0: true, 1: true}))
		Expect(tokens).To(HaveLen(2))
		code, full := a.call(http.MethodPost, path("pool", ""))
		Expect(code).To(Equal(http.StatusConflict))
		Expect(full.Reason).To(Equal("locked"))

		code, mode := a.call(http.MethodPost, path("mutex", "", "shared=true"))
		Expect(code).To(Equal(http.StatusBadRequest))
		Expect(mode.Reason).To(Equal("mode"))
	})

	It("answers bad requests with 400 naming the problem, and unknown endpoints and methods with JSON 404 and 405", func(ctx SpecContext) {
		a := startAgent(ctx, ns)
		for req, want := range map[string]string{
			path("k", "", "wait=forever"):       `wait must be a duration such as 10s or 1m, or whole seconds, got \"forever\"`,
			path("k", "", "wait=2h"):            "wait 2h0m0s is outside 0s..1h0m0s",
			path("k", "", "lease=0"):            "lease 0s is outside 1s..1h0m0s",
			path("k", "", "lease=1500ms"):       "lease must be whole seconds, got 1.5s",
			path("k", "", "shraed=true"):        `unknown parameter \"shraed\": POST takes wait, lease or shared`,
			path("k", "", "wait=1s&wait=2s"):    "parameter wait is given 2 times",
			path("k", "", "shared=yes"):         `shared must be true or false, got \"yes\"`,
			path(strings.Repeat("k", 1025), ""): "lock key is 1025 bytes long; the limit is 1024 (a key is one path segment: escape / as %2F)",
			path("order-\xff", ""):              "lock key is not valid UTF-8",
			path("order\n42", ""):               "lock key has a control character at byte 5: keys are text",
		} {
			code, body := a.raw(http.MethodPost, req, "")
			Expect(code).To(Equal(http.StatusBadRequest), "%s", req)
			Expect(body).To(ContainSubstring(want), "%s", req)
			Expect(body).To(ContainSubstring(`"reason":"bad-request"`), "%s", req)
		}
		code, body := a.raw(http.MethodPost, path("k", ""), `{"wait": "10s"}`)
		Expect(code).To(Equal(http.StatusBadRequest))
		Expect(body).To(ContainSubstring("parameters go in the query string"))
		code, missing := a.call(http.MethodDelete, path("k", ""))
		Expect(code).To(Equal(http.StatusBadRequest))
		Expect(missing.Error).To(ContainSubstring("leaseID is required"))
		code, unknown := a.call(http.MethodDelete, path("k", "", "leaseID=0123"))
		Expect(code).To(Equal(http.StatusNotFound))
		Expect(unknown.Reason).To(Equal("not-held"))
		code, slash := a.call(http.MethodPost, "/v1/locks/orders/42")
		Expect(code).To(Equal(http.StatusNotFound))
		Expect(slash.Error).To(ContainSubstring("escape / in a key as %2F"))
		code, method := a.call(http.MethodPut, path("k", ""))
		Expect(code).To(Equal(http.StatusMethodNotAllowed))
		Expect(method.Error).To(ContainSubstring("PUT is not a method of /v1/locks/k"))

		// What a web page can send to 127.0.0.1 without a preflight: a POST
		// with an Origin, or (DNS rebinding) with its own name as Host.
		for header, value := range map[string]string{"Origin": "https://attacker.example", "Host": "attacker.example:8477"} {
			req, err := http.NewRequest(http.MethodPost, a.url+path("k", ""), nil) //nolint:noctx // a local test endpoint
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set(header, value)
			if header == "Host" {
				req.Host = value
			}
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			var refused answer
			Expect(json.NewDecoder(resp.Body).Decode(&refused)).To(Succeed())
			Expect(resp.Body.Close()).To(Succeed())
			Expect(resp.StatusCode).To(Equal(http.StatusForbidden), header)
			Expect(refused.Reason).To(Equal("not-local"), header)
		}
		code, body = a.raw(http.MethodGet, "/v1/locks", "")
		Expect(code).To(Equal(http.StatusOK))
		Expect(body).To(MatchJSON(`{"holdings": []}`), "a refused request takes no lock")
		// A minimal HTTP/1.0 client sends no Host; no browser does that.
		conn, err := net.Dial("tcp", strings.TrimPrefix(a.url, "http://"))
		Expect(err).NotTo(HaveOccurred())
		_, err = conn.Write([]byte("GET /healthz HTTP/1.0\r\n\r\n"))
		Expect(err).NotTo(HaveOccurred())
		reply, err := io.ReadAll(conn)
		Expect(err).NotTo(HaveOccurred())
		Expect(conn.Close()).To(Succeed())
		Expect(string(reply)).To(HavePrefix("HTTP/1.0 200 OK"))
	})

	It("releases every holding and closes its session on SIGTERM", func(ctx SpecContext) {
		a := startAgent(ctx, ns)
		var held []answer
		for _, key := range []string{"a", "b"} {
			code, h := a.call(http.MethodPost, path(key, ""))
			Expect(code).To(Equal(http.StatusOK), h.Error)
			held = append(held, h)
		}
		a.s.Signal(syscall.SIGTERM)
		Eventually(a.s).Should(gexec.Exit(0))
		Expect(a.s.Err).To(gbytes.Say("released every lock, closed the session"))
		for _, h := range held {
			l := lockNamed(ctx, h.Lock)
			Expect(l.Status.Holder).To(BeNil())
			Expect(l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1].EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		}
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: held[0].Session}, &locksv1alpha1.LockSession{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the session is deleted: %v", err)
	})

	It("takes only locks that exist with --create=false (404 no-lock), and exits 77 when RBAC refuses it a session", func(ctx SpecContext) {
		a := startAgent(ctx, ns, "--create=false")
		code, missing := a.call(http.MethodPost, path("nowhere", ""))
		Expect(code).To(Equal(http.StatusNotFound))
		Expect(missing.Reason).To(Equal("no-lock"))

		nobody, err := env.AddUser(envtest.User{Name: "agent-nobody"}, nil)
		Expect(err).NotTo(HaveOccurred())
		cmd := exec.Command(kubelock, "--kubeconfig", kubeconfig("agent-nobody", nobody.Config()), "-n", ns, "agent", "--listen", "127.0.0.1:0")
		s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Eventually(s).Should(gexec.Exit(icli.ExitDenied))
		Expect(s.Err).To(gbytes.Say(`creating a session in ` + ns + `: .*forbidden`))
	})
})
