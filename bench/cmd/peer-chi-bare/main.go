// Command peer-chi-bare is the bench's bare peer for refused creates: the same chi
// server as peer-chi-redis-rate with no store at all. It decodes the create body and
// answers 429 at once: the ceiling of the HTTP part alone. With -space-answer that 429
// is space-api's own answer, headers and body. With -constant it reads no body and
// writes one pre-rendered 429: the limit of HTTP itself on the machine. See package
// peer.
//
//	peer-chi-bare -addr 127.0.0.1:8082 [-space-answer | -constant]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/space-sandbox/space/bench/peer"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8082", "listen address")
	constant := flag.Bool("constant", false, "read no body and answer one pre-rendered 429")
	spaceAnswer := flag.Bool("space-answer", false, "answer space-api's 429 to the bench's refused client, headers and body")
	flag.Parse()
	h := peer.Handler(peer.RefuseAll)
	switch {
	case *constant:
		h = peer.Constant()
	case *spaceAnswer:
		h = peer.SpaceAnswer()
	}
	if err := peer.Serve(*addr, h); err != nil {
		fmt.Fprintln(os.Stderr, "peer-chi-bare:", err)
		os.Exit(1)
	}
}
