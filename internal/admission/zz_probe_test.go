package admission

import (
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/testenv"
)

func TestZZProbe(t *testing.T) {
	b := setup(t, testenv.Redis(t), enabled(space.Rate{RefillRPS: 1e-6, Burst: 1000}))
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / 7)
	start := time.Now()
	for i := range 20 {
		wg.Go(func() {
			at := time.Since(start)
			ch, err := b.adm.Charge(b.ctx, space.Charge{Key: "acme", Rate: rate(10, 10), Soft: rate(5, 5), Tier: "pro", Cost: 1})
			t.Logf("%d %v %v %v", i, at, ch, err)
		})
		<-tick.C
	}
	wg.Wait()
}
