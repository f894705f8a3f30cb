package testenv

import "net/http"

// StatusWriter is an http.ResponseWriter that keeps the status and drops the body:
// what a handler's benchmark writes to, so that it times the handler rather than a
// recorder's buffer. space-api's BenchmarkRefusalHandler and the peers'
// BenchmarkHandler (bench/peer) write to it alike. Its Header starts empty.
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
