package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// runRaw sends the stream as a plain HTTP/1.1 client over l.Conns connections, each
// sending the next request that is due once its previous answer is in: an open loop
// at l.Rate, as wrk2 -c Conns -R Rate, each latency counted from when its request was
// due, so a request that waited for a connection counts its wait. When it is sent is
// kept too (the answer's wait): what the stream offered a second is what it sent,
// which is less than Rate when its connections were all waiting or it lacked the CPU.
// A request still unsent rawGrace after the stream's end is not sent (counted in
// Unsent): the stream ends on time, whatever it could not offer.
//
// It is the fixed flood's generator. vegeta spent about 110 µs of CPU a request (0.57
// cores at 5,000/s in the recorded runs, as much as the server it measured), on two
// cores where that CPU is taken from the server, Postgres and Redis; a flooding
// client is on another machine. This one writes a pre-rendered request and reads the
// status line, the headers it needs and the body, and nothing else.
func (l load) runRaw(ctx context.Context) (*loadResult, error) {
	if l.Rate <= 0 || l.Conns <= 0 {
		return nil, fmt.Errorf("load %s: a raw stream needs a rate and connections", l.Name)
	}
	u, err := url.Parse(l.URL)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", l.Name, err)
	}
	name, value := identityHeader(l.Client, l.Key)
	req := []byte("POST /v1/sandboxes HTTP/1.1\r\nHost: " + u.Host + "\r\nContent-Type: application/json\r\n" + name + ": " + value +
		"\r\nContent-Length: " + strconv.Itoa(len(l.Body)) + "\r\n\r\n" + l.Body)
	interval := time.Second / time.Duration(l.Rate)
	total := int(l.Duration / interval)
	if l.MaxRequests > 0 {
		total = min(total, l.MaxRequests)
	}

	// The pacer hands out due times a millisecond's worth at a time: one wake-up a
	// millisecond rather than one a request.
	due := make(chan time.Time, total)
	start := time.Now()
	go func() {
		defer close(due)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for i := 0; i < total; {
			for ; i < total; i++ {
				d := start.Add(time.Duration(i) * interval)
				if d.After(time.Now()) {
					break
				}
				due <- d
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	type answer struct {
		outcome string
		due     time.Time
		wait    time.Duration // from due to sent
		latency time.Duration
	}
	answers := make([][]answer, l.Conns)
	unsent := make([]int, l.Conns)
	end := start.Add(l.Duration + rawGrace)
	var wg sync.WaitGroup
	for c := range l.Conns {
		wg.Go(func() {
			var conn net.Conn
			var r *bufio.Reader
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for d := range due {
				if time.Now().After(end) {
					unsent[c]++
					continue
				}
				if conn == nil {
					var err error
					if conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", u.Host); err != nil {
						conn = nil
						answers[c] = append(answers[c], answer{"error", d, time.Since(d), time.Since(d)})
						continue
					}
					r = bufio.NewReader(conn)
				}
				sent := time.Now()
				_ = conn.SetDeadline(sent.Add(30 * time.Second))
				code, body, err := exchange(conn, r, req)
				answers[c] = append(answers[c], answer{outcome(code, body), d, sent.Sub(d), time.Since(d)})
				if err != nil {
					conn.Close()
					conn = nil
				}
			}
		})
	}
	wg.Wait()
	res := newLoadResult(l.Name)
	res.First = start
	for c, as := range answers {
		for _, a := range as {
			res.addSent(a.outcome, a.due.Sub(start), a.wait, a.latency)
			res.Elapsed = max(res.Elapsed, a.due.Add(a.latency).Sub(start))
		}
		res.Unsent += unsent[c]
	}
	return res, nil
}

// rawGrace is how late after its stream's end a raw stream still sends a request
// that was due before it.
const rawGrace = time.Second

// exchange writes req on conn and reads its answer: the status code and the body
// (kept only when short: the outcome reads a 429's bucket or a 201's warm flag).
// Code 0 with an error is no answer; an error with a code means the connection cannot
// carry another request.
func exchange(conn net.Conn, r *bufio.Reader, req []byte) (int, []byte, error) {
	if _, err := conn.Write(req); err != nil {
		return 0, nil, err
	}
	tp := textproto.NewReader(r)
	status, err := tp.ReadLine()
	if err != nil {
		return 0, nil, err
	}
	// HTTP/1.1 429 Too Many Requests
	f := strings.Fields(status)
	if len(f) < 2 {
		return 0, nil, fmt.Errorf("status line %q", status)
	}
	code, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, nil, fmt.Errorf("status line %q", status)
	}
	length, closing, chunked := -1, false, false
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return 0, nil, err
		}
		if line == "" {
			break
		}
		name, value, _ := strings.Cut(line, ":")
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "content-length":
			if length, err = strconv.Atoi(strings.TrimSpace(value)); err != nil {
				return 0, nil, fmt.Errorf("content-length %q", value)
			}
		case "connection":
			closing = strings.EqualFold(strings.TrimSpace(value), "close")
		case "transfer-encoding":
			chunked = strings.EqualFold(strings.TrimSpace(value), "chunked")
		}
	}
	var body []byte
	switch {
	case chunked:
		for {
			line, err := tp.ReadLine()
			if err != nil {
				return 0, nil, err
			}
			size, err := strconv.ParseInt(strings.TrimSpace(strings.SplitN(line, ";", 2)[0]), 16, 32)
			if err != nil {
				return 0, nil, fmt.Errorf("chunk size %q", line)
			}
			if size == 0 {
				if _, err := tp.ReadLine(); err != nil { // the last CRLF (no trailers here)
					return 0, nil, err
				}
				break
			}
			chunk := make([]byte, size+2) // the chunk and its CRLF
			if _, err := io.ReadFull(r, chunk); err != nil {
				return 0, nil, err
			}
			body = append(body, chunk[:size]...)
		}
	case length >= 0:
		body = make([]byte, length)
		if _, err := io.ReadFull(r, body); err != nil {
			return 0, nil, err
		}
	default:
		return code, nil, fmt.Errorf("an answer with neither Content-Length nor chunks (status %d)", code)
	}
	if closing {
		return code, body, io.EOF
	}
	return code, body, nil
}
