// Package openapi holds the OpenAPI 3.1 description of both of space-api's listeners,
// api/openapi.yaml, built into the binary so that the internal listener serves the very
// document the end-to-end tests check every answer against.
package openapi

import _ "embed"

//go:embed openapi.yaml
var document []byte

// Document returns api/openapi.yaml as built into the binary. The slice is shared:
// callers must not modify it.
func Document() []byte { return document }
