package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/space-sandbox/space"
)

// keptUntilAnswered returns the writer a request holding lease answers through, and
// what to defer: the answer's end, then the lease given back.
//
// A roomy lease (space.Lease.Roomy: its key holds at most half its cap) is given back
// after the answer has reached the connection, so that its caller does not wait for
// the round trip to Redis that frees the place: the answer is kept whole in memory,
// then written with its length and flushed (a caller has its whole answer then, not
// when the handler returns), and only then is the place given back. A lease that is
// not roomy is given back first, as the handler returns and before net/http ends the
// answer: a key near its cap, answered, may send its next request at once and must
// not find its last one's place still taken.
//
// The request's duration in the access log and the request metrics is the time to
// its answer (see observe), not to the lease's release.
func keptUntilAnswered(w http.ResponseWriter, r *http.Request, lease space.Lease) (http.ResponseWriter, func()) {
	if !lease.Roomy {
		return w, lease.Release
	}
	a := &answerFirst{w: w}
	return a, func() {
		if a.send() {
			if st := stateFrom(r.Context()); st != nil {
				st.answered = time.Now()
			}
		}
		lease.Release()
	}
}

// answerFirst keeps an answer in memory until send writes it whole.
type answerFirst struct {
	w      http.ResponseWriter
	status int
	body   []byte
}

func (a *answerFirst) Header() http.Header { return a.w.Header() }

func (a *answerFirst) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *answerFirst) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	a.body = append(a.body, p...)
	return len(p), nil
}

// Unwrap is the writer underneath, for http.ResponseController.
func (a *answerFirst) Unwrap() http.ResponseWriter { return a.w }

// send writes the answer kept, with its Content-Length (a status that carries a body),
// and flushes it to the connection; it reports whether it wrote one. A handler that
// wrote nothing (one that panicked before answering, which observe answers 500)
// leaves the answer to whatever comes after it.
func (a *answerFirst) send() (sent bool) {
	status := a.status
	if status == 0 {
		return false
	}
	if status != http.StatusNoContent && status != http.StatusNotModified {
		a.w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
	}
	a.w.WriteHeader(status)
	if len(a.body) > 0 {
		_, _ = a.w.Write(a.body)
	}
	_ = http.NewResponseController(a.w).Flush()
	return true
}
