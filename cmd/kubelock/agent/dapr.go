package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kubelock/kubelock/pkg/lock"
)

// Dapr's distributed lock API, as Dapr's HTTP API serves it: the same paths,
// request and response shapes, status codes and error codes, so that an app
// written against Dapr (its JavaScript SDK, or plain HTTP) runs against the
// agent with DAPR_HTTP_PORT pointed at it. The lock response carries the
// holding's fencing token as an extra field. Dapr's SDKs that take locks over
// gRPC (Go, Python, Java, .NET) are not served.
func (a *Agent) daprRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1.0-alpha1/lock/{store}", a.daprLock)
	mux.HandleFunc("POST /v1.0-alpha1/unlock/{store}", a.daprUnlock)
	// What the SDKs ask before their first call: the JavaScript SDK reads
	// the metadata, the others the outbound health.
	mux.HandleFunc("GET /v1.0/healthz", a.daprHealthz)
	mux.HandleFunc("GET /v1.0/healthz/outbound", a.daprHealthz)
	mux.HandleFunc("GET /v1.0/metadata", a.daprMetadata)
}

// Dapr's error codes (errorCode) that the lock API answers with.
const (
	daprMalformed     = "ERR_MALFORMED_REQUEST"
	daprStoreNotFound = "ERR_LOCK_STORE_NOT_FOUND"
	daprTryLock       = "ERR_TRY_LOCK"
	daprUnlock        = "ERR_UNLOCK"
	daprNotReady      = "ERR_HEALTH_NOT_READY"
)

// Dapr's unlock statuses.
const (
	unlockSuccess        = 0
	unlockDoesNotExist   = 1
	unlockBelongsToOther = 2
)

// daprError is Dapr's JSON of an error.
type daprError struct {
	ErrorCode string `json:"errorCode"`
	Message   string `json:"message"`
}

func writeDaprError(w http.ResponseWriter, code int, errorCode, format string, args ...any) {
	writeJSON(w, code, daprError{ErrorCode: errorCode, Message: fmt.Sprintf(format, args...)})
}

// daprRequest is the body of Dapr's lock and unlock requests.
type daprRequest struct {
	ResourceID      string `json:"resourceId"`
	LockOwner       string `json:"lockOwner"`
	ExpiryInSeconds int32  `json:"expiryInSeconds"`
}

// maxOwner bounds a lockOwner: the agent keeps it in memory.
const maxOwner = 1024

// maxDaprBody bounds a request body: three short fields.
const maxDaprBody = 16 << 10

// daprDecode reads the request and checks it in Dapr's order (for a lock,
// the expiry first); it writes Dapr's error and returns false when it is
// malformed.
func (a *Agent) daprDecode(w http.ResponseWriter, r *http.Request, isLock bool) (daprRequest, bool) {
	var req daprRequest
	store := r.PathValue("store")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDaprBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeDaprError(w, http.StatusRequestEntityTooLarge, daprMalformed, "the request body is longer than %d bytes", maxDaprBody)
		return req, false
	case err != nil:
		writeDaprError(w, http.StatusBadRequest, daprMalformed, "failed reading HTTP body: %v", err)
		return req, false
	}
	// The whole body, as Dapr reads it: trailing bytes are malformed too.
	if err := json.Unmarshal(body, &req); err != nil {
		writeDaprError(w, http.StatusBadRequest, daprMalformed, "failed deserializing HTTP body: %v", err)
		return req, false
	}
	var problem string
	switch {
	case isLock && req.ExpiryInSeconds <= 0:
		problem = "ExpiryInSeconds is not positive in lock store %s"
	case req.ResourceID == "":
		problem = "ResourceId is empty in lock store %s"
	case req.LockOwner == "":
		problem = "LockOwner is empty in lock store %s"
	case len(req.LockOwner) > maxOwner:
		problem = fmt.Sprintf("LockOwner is longer than %d bytes in lock store %%s", maxOwner)
	}
	if problem != "" {
		writeDaprError(w, http.StatusBadRequest, daprMalformed, problem, shown(store))
		return req, false
	}
	if !slices.Contains(a.o.DaprStores, store) {
		writeDaprError(w, http.StatusBadRequest, daprStoreNotFound, "lock store %s not found (this agent serves %s)", shown(store), strings.Join(a.o.DaprStores, ", "))
		return req, false
	}
	if err := checkKey(req.ResourceID); err != nil {
		writeDaprError(w, http.StatusBadRequest, daprMalformed, "ResourceId: %v", err)
		return req, false
	}
	return req, true
}

// daprLock is Dapr's TryLock: never waits; {"success": false} while someone
// (another owner, or the same one: Dapr's locks are not reentrant) holds it.
// The holding ends after expiryInSeconds unless unlocked first.
func (a *Agent) daprLock(w http.ResponseWriter, r *http.Request) {
	req, ok := a.daprDecode(w, r, true)
	if !ok {
		return
	}
	h, err := a.take(r.Context(), req.ResourceID, 0, false, time.Duration(req.ExpiryInSeconds)*time.Second, req.LockOwner)
	switch {
	case errors.Is(err, lock.ErrLocked):
		writeJSON(w, http.StatusOK, map[string]any{"success": false})
	case err != nil:
		writeDaprError(w, http.StatusInternalServerError, daprTryLock, "failed to try acquiring lock: %v", err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"success": true, "fencingToken": h.l.FencingToken()})
	}
}

// daprUnlock is Dapr's Unlock: status 0 when the owner's holding was
// released, 2 while someone else holds the lock (another owner here, or
// another holder anywhere), 1 when nobody does.
func (a *Agent) daprUnlock(w http.ResponseWriter, r *http.Request) {
	req, ok := a.daprDecode(w, r, false)
	if !ok {
		return
	}
	for _, h := range a.holdings(func(h *holding) bool { return h.key == req.ResourceID && h.owner == req.LockOwner }) {
		claimed, err := a.end(h, endReleased)
		switch {
		case claimed && err == nil:
			writeJSON(w, http.StatusOK, map[string]any{"status": unlockSuccess})
			return
		case claimed && !errors.Is(err, lock.ErrLockLost):
			writeDaprError(w, http.StatusInternalServerError, daprUnlock, "failed to release lock: %v", err)
			return
		}
	}
	// Not this owner's, or lost in the meantime: whose is it?
	obj, err := a.c.Get(r.Context(), req.ResourceID)
	switch {
	case errors.Is(err, lock.ErrNotFound):
		writeJSON(w, http.StatusOK, map[string]any{"status": unlockDoesNotExist})
	case err != nil:
		writeDaprError(w, http.StatusInternalServerError, daprUnlock, "failed to release lock: %v", err)
	case len(obj.Status.Holdings()) > 0:
		writeJSON(w, http.StatusOK, map[string]any{"status": unlockBelongsToOther})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"status": unlockDoesNotExist})
	}
}

// daprHealthz answers as Dapr's health endpoints: 204 while ready.
func (a *Agent) daprHealthz(w http.ResponseWriter, _ *http.Request) {
	if !a.Ready() {
		writeDaprError(w, http.StatusInternalServerError, daprNotReady, "kubelock agent not ready: it has no session to take locks in yet")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// daprComponent is one component in Dapr's metadata.
type daprComponent struct {
	Name         string   `json:"name"`
	Type         string   `json:"type"`
	Version      string   `json:"version"`
	Capabilities []string `json:"capabilities"`
}

// daprMetadata is the part of Dapr's metadata that names the lock stores.
func (a *Agent) daprMetadata(w http.ResponseWriter, _ *http.Request) {
	components := []daprComponent{}
	for _, s := range a.o.DaprStores {
		components = append(components, daprComponent{Name: s, Type: "lock.kubelock", Version: "v1", Capabilities: []string{}})
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id":              a.c.Identity(),
		"runtimeVersion":  "kubelock-agent/" + a.o.Version,
		"enabledFeatures": []string{},
		"components":      components,
		"extended":        map[string]string{"namespace": a.c.Namespace()},
	})
}
