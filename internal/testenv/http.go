package testenv

import (
	"net/http"
	"net/http/httptest"
	"strings"
)

// CreateRequest is a create of a python-3.12 sandbox (500 millicores, 1 GiB, 5 GiB of
// disk) from client, as a trusted proxy on loopback sends it (X-Client-ID), for a
// handler to serve without a socket. space-api's BenchmarkRefusalHandler and the
// peers' BenchmarkHandler (bench/peer) send it alike, so that their figures compare.
func CreateRequest(client string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/v1/sandboxes", strings.NewReader(`{"template":"python-3.12","cpu_millis":500,"memory_mib":1024,"disk_gib":5}`))
	req.RemoteAddr = "127.0.0.1:40000"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Client-ID", client)
	return req
}

// StatusWriter is an http.ResponseWriter that keeps the status and drops the body:
// what a handler's benchmark writes to, so that it times the handler rather than a
// recorder's buffer. Its Header starts empty.
type StatusWriter struct {
	h http.Header
	// Status is the status written, 0 until one is.
	Status int
}

// Header is the answer's header map, made at the first call.
func (w *StatusWriter) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{}
	}
	return w.h
}

// Write drops p.
func (w *StatusWriter) Write(p []byte) (int, error) { return len(p), nil }

// WriteHeader keeps status.
func (w *StatusWriter) WriteHeader(status int) { w.Status = status }
