// Package fencedstore is a protected resource for the suites that run the
// lock worker of docs/examples: an HTTP store of work items behind
// pkg/fencing's Middleware (issuance checked with an APIVerifier, the
// highest token kept per lock in memory), which records every write it
// accepts, in order. Each item is guarded by the lock of the same key.
package fencedstore

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/lock"
)

// Write is one write the store accepted.
type Write struct {
	Item   string
	Writer string
	Step   int
	Token  int64
}

// Store is a running store.
type Store struct {
	// URL is where it serves: POST URL/ITEM, the item escaped as one segment.
	URL string

	srv      *http.Server
	verifier *fencing.APIVerifier
	// serve serialises requests, the fence's check with the write it lets
	// through, so that writes are recorded in the order they were accepted.
	serve  sync.Mutex
	mu     sync.Mutex
	writes []Write
}

// Start serves items, each guarded by the lock of its key in ns, on addr
// (host:port; port 0 picks one). cfg reads the locks.
func Start(cfg *rest.Config, addr, ns string, items []string) (*Store, error) {
	locks := map[string]fencing.LockRef{}
	for _, item := range items {
		name, err := lock.NameForKey(item)
		if err != nil {
			return nil, err
		}
		locks[item] = fencing.LockRef{Namespace: ns, Name: name}
	}
	verifier, err := fencing.NewAPIVerifierForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		verifier.Close()
		return nil, err
	}
	s := &Store{URL: "http://" + ln.Addr().String(), verifier: verifier}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /{item}", s.write)
	fence := fencing.Fence{Locks: locks, Verifier: s.verifier, Store: fencing.NewMemoryStore()}
	fenced := fencing.Middleware(fence, mux)
	serial := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.serve.Lock()
		defer s.serve.Unlock()
		fenced.ServeHTTP(w, r)
	})
	s.srv = &http.Server{Handler: serial, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// write records an accepted write: the fence let it through.
func (s *Store) write(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Writer string `json:"writer"`
		Step   int    `json:"step"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, `{"error": "malformed body"}`, http.StatusBadRequest)
		return
	}
	token, _ := strconv.ParseInt(r.Header.Get(fencing.HeaderToken), 10, 64) // the fence parsed it
	s.mu.Lock()
	s.writes = append(s.writes, Write{Item: r.PathValue("item"), Writer: body.Writer, Step: body.Step, Token: token})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"accepted": true}` + "\n"))
}

// Writes are the accepted writes, in the order they were accepted.
func (s *Store) Writes() []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Write(nil), s.writes...)
}

// Close stops serving and the verifier's watches.
func (s *Store) Close() {
	_ = s.srv.Close()
	s.verifier.Close()
}
