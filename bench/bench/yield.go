package bench

import (
	"context"
	"os/exec"
	"strconv"
)

// yieldNice is the niceness a flood's generator runs at: the lowest CPU priority. On
// this machine the flood's sender shares the two cores with the server it floods,
// the server's Postgres and Redis, and the quiet client; a flooding client's own
// machine would not. At the lowest priority it takes only the CPU that nothing else
// wants at that moment, so that what a neighbour's latency measures is what the
// server's own work for the flood costs it (that work keeps its priority), not what
// the flood's sender does on the same cores. It still sends what it is asked to, or
// as fast as it goes with what is left: the report gives the flood's answers a second.
const yieldNice = 19

// generatorCommand is the command that runs bin with args as a load generator: under
// nice(1) at yieldNice when yield is set, which keeps the process's pid (nice execs
// bin) for the CPU it is counted.
func generatorCommand(ctx context.Context, yield bool, bin string, args ...string) *exec.Cmd {
	if !yield {
		return exec.CommandContext(ctx, bin, args...)
	}
	return exec.CommandContext(ctx, "nice", append([]string{"-n", strconv.Itoa(yieldNice), bin}, args...)...)
}
