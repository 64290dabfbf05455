// Package check validates the Kubernetes manifests offline: it renders each kustomize overlay,
// decodes the built-in objects strictly, validates the custom resources against the operators'
// CRD schemas and asserts the properties the deployment promises. Its tests are the checks.
package check
