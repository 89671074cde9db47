package testenv

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Kubectl adds the admin user name (group system:masters) and returns a
// function that runs the control plane's kubectl (in AssetsDir) as that user
// and returns its stdout followed by its stderr.
func (e *Env) Kubectl(name string) (func(args ...string) (string, error), error) {
	admin, err := e.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	return func(args ...string) (string, error) {
		k, err := admin.Kubectl()
		if err != nil {
			return "", err
		}
		k.Path = filepath.Join(AssetsDir(), "kubectl")
		stdout, stderr, err := k.Run(args...)
		out, _ := io.ReadAll(stdout)
		msg, _ := io.ReadAll(stderr)
		return string(out) + string(msg), err
	}, nil
}

// StandInCRD is a namespaced CRD for another project's kind (cert-manager's,
// the Prometheus Operator's) whose v1 accepts any content: with it installed,
// a server-side dry run checks such objects' kind, version, namespace and
// metadata, not their spec.
func StandInCRD(group, kind, plural string) string {
	return fmt.Sprintf(`---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[3]s.%[1]s
spec:
  group: %[1]s
  scope: Namespaced
  names: {kind: %[2]s, plural: %[3]s, singular: %[4]s, listKind: %[2]sList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, group, kind, plural, strings.ToLower(kind))
}
