// Package config embeds the manifests that kubelock-dev installs into its
// local control plane, so the binary carries the CRD and webhook rules it was
// built with. The files are the kustomize sources in this folder; nothing here
// is a second copy.
package config

import "embed"

// FS holds the CRDs, the generated webhook configuration, the policy engine's
// ValidatingAdmissionPolicies and bindings, the fenced-objects webhook
// configuration, the lock-user and break-glass ClusterRoles and the sample
// lock-user RBAC.
//
//go:embed crd/bases/*.yaml webhook/manifests.yaml policy/*.yaml fenced-objects/webhook.yaml rbac/lock_user_role.yaml rbac/breakglass_role.yaml samples/lock_user_rbac.yaml
var FS embed.FS
