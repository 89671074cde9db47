// Package openapi holds the lock API's OpenAPI definitions, generated from
// api/v1alpha1 by kube-openapi's openapi-gen (make generate). The lock
// apiserver publishes them; server-side apply reads list types and keys from
// them, and kubectl explain the descriptions.
package openapi
