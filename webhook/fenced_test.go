package webhook

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestValidateFencedUpdate(t *testing.T) {
	obj := func(ann map[string]string) *metav1.ObjectMeta { return &metav1.ObjectMeta{Annotations: ann} }
	fenced := func(token string) map[string]string {
		m := map[string]string{FencedByAnnotation: "db"}
		if token != "" {
			m[FencingTokenAnnotation] = token
		}
		return m
	}
	cases := []struct {
		name      string
		old, new  map[string]string
		lockToken int64
		want      string // "" = allowed
	}{
		{name: "not fenced", old: map[string]string{}, new: map[string]string{}, lockToken: -1},
		{name: "first token", old: fenced(""), new: fenced("10"), lockToken: 10},
		{name: "equal token", old: fenced("10"), new: fenced("10"), lockToken: 12},
		{name: "higher token", old: fenced("10"), new: fenced("12"), lockToken: 12},
		{name: "stale token", old: fenced("12"), new: fenced("10"), lockToken: 12, want: "stale fencing token 10 for lock \"db\": this object already accepted token 12"},
		{name: "missing token", old: fenced("12"), new: map[string]string{FencedByAnnotation: "db"}, lockToken: 12, want: "must carry the locks.kubelock.io/fencing-token annotation"},
		{name: "malformed token", old: fenced("12"), new: fenced("x12"), lockToken: 12, want: "not a positive integer"},
		{name: "token never issued", old: fenced("12"), new: fenced("99"), lockToken: 12, want: "token 99 was never issued"},
		{name: "lock gone", old: fenced("12"), new: fenced("13"), lockToken: -1, want: "does not exist"},
		{name: "removing the fence needs a current token too", old: fenced("12"), new: map[string]string{}, lockToken: 12, want: "must carry"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateFencedUpdate(obj(tc.old), obj(tc.new), tc.lockToken)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("denied: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "[kubelock:stale-token]") {
				t.Fatalf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
