package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// HeapPoint is one sample of a replica's memory, taken after a collection the bench
// forced (GET /debug/pprof/heap?gc=1 on the internal listener runs runtime.GC first),
// so that every point counts what is live, not what the collector had yet to reach.
type HeapPoint struct {
	// Tenants is how many distinct tenants had created when it was taken.
	Tenants int
	// HeapInuse and HeapAlloc are go_memstats_heap_inuse_bytes and
	// go_memstats_heap_alloc_bytes from /metrics, read right after the collection; RSS
	// is VmRSS of /proc/<pid>/status; all in bytes.
	HeapInuse, HeapAlloc, RSS float64
	// Series is the number of samples /metrics serves (its lines not starting with
	// '#').
	Series int
	// Sites are the allocation sites of the live heap, largest first, from the heap
	// profile of the same collection.
	Sites []HeapSite
}

// HeapSite is live heap by where it was allocated: the innermost function of the
// product on the stack and its caller in the product (so that keyed.Map's entries
// read as whose map they are), or the innermost function outside the runtime when no
// product function is on the stack.
type HeapSite struct {
	Site  string
	Bytes float64
}

// productPrefix starts every function name of the product's packages.
const productPrefix = "github.com/space-sandbox/space/"

// sampleHeap forces a collection in srv, reads its heap profile (kept in the file
// save, which -keep keeps), /metrics and its RSS.
func sampleHeap(ctx context.Context, srv *apiServer, tenants int, save string) (HeapPoint, error) {
	p := HeapPoint{Tenants: tenants}
	prof, err := httpGet(ctx, srv.InternalURL+"/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return p, fmt.Errorf("heap profile: %w", err)
	}
	if err := os.WriteFile(save, prof, 0o600); err != nil {
		return p, fmt.Errorf("keep the heap profile: %w", err)
	}
	p.Sites = heapSites(prof, 0)
	metrics, err := httpGet(ctx, srv.InternalURL+"/metrics")
	if err != nil {
		return p, err
	}
	p.HeapInuse = sumMetric(metrics, "go_memstats_heap_inuse_bytes")
	p.HeapAlloc = sumMetric(metrics, "go_memstats_heap_alloc_bytes")
	p.Series = seriesCount(metrics)
	if p.RSS, err = vmRSS(srv.pid()); err != nil {
		return p, err
	}
	return p, nil
}

// seriesCount is the number of samples in a /metrics answer.
func seriesCount(body []byte) int {
	n := 0
	for line := range strings.SplitSeq(string(body), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			n++
		}
	}
	return n
}

// vmRSS is the resident set of process pid, in bytes.
func vmRSS(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("read the replica's status: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseFloat(f[0], 64)
				return kb * 1024, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// heapSites reads a heap profile in the text form of runtime/pprof (debug=1) and
// returns the live bytes by site, largest first (the top ones, or all for top ≤ 0). Each record's counts are of the
// sampled allocations; they are scaled up by the sampling rate as the pprof tool
// does (an allocation of s bytes is sampled with probability 1 − e^(−s/rate)).
func heapSites(prof []byte, top int) []HeapSite {
	sc := bufio.NewScanner(bytes.NewReader(prof))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	rate := 512 * 1024.0
	bySite := map[string]float64{}
	var objects, size float64
	var frames []string
	flush := func() {
		if size > 0 && objects > 0 {
			scale := 1.0
			if rate > 1 {
				scale = 1 / (1 - math.Exp(-size/objects/rate))
			}
			bySite[siteOf(frames)] += size * scale
		}
		objects, size, frames = 0, 0, nil
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "heap profile:"):
			// heap profile: N: B [N: B] @ heap/<2 × MemProfileRate>
			if _, r, ok := strings.Cut(line, "@ heap/"); ok {
				if v, err := strconv.ParseFloat(strings.TrimSpace(r), 64); err == nil && v > 0 {
					rate = v / 2
				}
			}
		case strings.HasPrefix(line, "# runtime.MemStats"):
			flush()
			return topSites(bySite, top)
		case strings.HasPrefix(line, "#\t"):
			// #	0x4a7c44	pkg.fn+0x24	/path/file.go:12
			f := strings.Split(line, "\t")
			if len(f) >= 3 {
				fn, _, _ := strings.Cut(f[2], "+0x")
				frames = append(frames, fn)
			}
		case strings.Contains(line, " @ "):
			flush()
			// inuse_objects: inuse_bytes [alloc_objects: alloc_bytes] @ addresses
			head, _, _ := strings.Cut(line, "[")
			a, b, ok := strings.Cut(head, ":")
			if ok {
				objects, _ = strconv.ParseFloat(strings.TrimSpace(a), 64)
				size, _ = strconv.ParseFloat(strings.TrimSpace(b), 64)
			}
		}
	}
	flush()
	return topSites(bySite, top)
}

// siteOf names a stack (innermost first) as HeapSite says.
func siteOf(frames []string) string {
	var product []string
	for _, f := range frames {
		if strings.HasPrefix(f, productPrefix) {
			product = append(product, shortFunc(f))
			if len(product) == 2 {
				break
			}
		}
	}
	switch len(product) {
	case 2:
		return product[0] + " ← " + product[1]
	case 1:
		return product[0]
	}
	for _, f := range frames {
		if !strings.HasPrefix(f, "runtime.") && !strings.HasPrefix(f, "internal/") && !strings.HasPrefix(f, "sync.") {
			return shortFunc(f)
		}
	}
	if len(frames) > 0 {
		return shortFunc(frames[0])
	}
	return "(no stack)"
}

// shortFunc drops the module path of a product function and the type arguments of a
// generic one: "keyed.(*Map[...]).LoadOrNew".
func shortFunc(f string) string {
	f = strings.TrimPrefix(f, productPrefix)
	f = strings.TrimPrefix(f, "internal/")
	var b strings.Builder
	depth := 0
	for _, r := range f {
		switch {
		case r == '[':
			if depth == 0 {
				b.WriteString("[...]")
			}
			depth++
		case r == ']':
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func topSites(bySite map[string]float64, top int) []HeapSite {
	sites := make([]HeapSite, 0, len(bySite))
	for s, b := range bySite {
		sites = append(sites, HeapSite{Site: s, Bytes: b})
	}
	slices.SortFunc(sites, func(a, b HeapSite) int {
		if a.Bytes != b.Bytes {
			if a.Bytes > b.Bytes {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Site, b.Site)
	})
	if top > 0 && len(sites) > top {
		sites = sites[:top]
	}
	return sites
}

// siteBytes is the live bytes of site in p, 0 when it is not among p's top sites.
func (p HeapPoint) siteBytes(site string) float64 {
	for _, s := range p.Sites {
		if s.Site == site {
			return s.Bytes
		}
	}
	return 0
}
