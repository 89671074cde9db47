package webhook

import (
	"context"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Quiet wraps an admission handler so that its errors never echo what it
// read: an error (not a denial) answers with a fixed message per status code,
// and the detail — which may quote the object or the stored lock, e.g. a
// time that failed to parse — goes to the operator's log only. Denials keep
// their rule messages. Register every handler through it.
func Quiet(h admission.Handler) admission.Handler { return quiet{h} }

type quiet struct{ h admission.Handler }

// Generic messages of errored admission responses.
const (
	MsgUndecodable   = "kubelock webhook: the object could not be decoded"
	MsgInternalError = "kubelock webhook: internal error; the operator's log has the details"
)

func (q quiet) Handle(ctx context.Context, req admission.Request) admission.Response {
	resp := q.h.Handle(ctx, req)
	r := resp.Result
	if resp.Allowed || r == nil || r.Reason == metav1.StatusReasonForbidden {
		return resp
	}
	logf.FromContext(ctx).WithName("webhook").Info("admission request errored",
		"uid", req.UID, "kind", req.Kind, "namespace", req.Namespace, "name", req.Name,
		"operation", req.Operation, "code", r.Code, "error", r.Message)
	msg := MsgInternalError
	if r.Code == http.StatusBadRequest {
		msg = MsgUndecodable
	}
	resp.Result = &metav1.Status{Code: r.Code, Message: msg}
	return resp
}
