// Command peer-chi-bare is the bench's bare peer for refused creates: the same chi
// server as peer-chi-redis-rate with no store at all. It decodes the create body and
// answers 429 at once: the ceiling of the HTTP part alone. See package peer.
//
//	peer-chi-bare -addr 127.0.0.1:8082
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/space-sandbox/space/bench/peer"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8082", "listen address")
	flag.Parse()
	if err := peer.Serve(*addr, peer.Handler(peer.RefuseAll)); err != nil {
		fmt.Fprintln(os.Stderr, "peer-chi-bare:", err)
		os.Exit(1)
	}
}
