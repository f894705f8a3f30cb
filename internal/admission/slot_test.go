package admission

import (
	"strings"
	"testing"

	"github.com/space-sandbox/space"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/testenv"
)

// crc16 is the CRC of the Redis Cluster specification: CRC-16/XMODEM (polynomial
// 0x1021, initial value 0, no reflection, no final xor), computed bit by bit.
func crc16(data string) uint16 {
	var crc uint16
	for i := 0; i < len(data); i++ {
		crc ^= uint16(data[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is a key's Redis Cluster slot: when the key has a '{' followed later by a
// '}' with at least one byte between them, only those bytes (the first such pair) are
// hashed.
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return int(crc16(key) % 16384)
}

func TestSlots(t *testing.T) {
	t.Parallel()

	// Clients whose keys would land anywhere without the hash tag, odd ones included.
	clients := []space.ClientKey{"acme", "globex", "unknown", "initech", "a", "{x}", "}{", "with:colons", "ünïcode", "0123456789"}

	t.Run("crc16 matches the spec check value", func(t *testing.T) {
		t.Parallel()
		if got := crc16("123456789"); got != 0x31C3 {
			t.Fatalf("CRC16(\"123456789\") = %#04x, want 0x31C3", got)
		}
		// The spec's hash tag examples.
		for _, tc := range []struct{ a, b string }{
			{"{user1000}.following", "user1000"},
			{"foo{}{bar}", "foo{}{bar}"},
			{"foo{{bar}}zap", "{bar"},
			{"foo{bar}{zap}", "bar"},
		} {
			if keySlot(tc.a) != int(crc16(tc.b)%16384) {
				t.Errorf("slot of %q is not that of %q", tc.a, tc.b)
			}
		}
	})

	t.Run("every client key shares the cluster key's slot", func(t *testing.T) {
		t.Parallel()
		for _, prefix := range []string{config.Default().Redis.KeyPrefix, "t0123456789ab", "space:staging"} {
			want := keySlot(ClusterKey(prefix))
			for _, client := range clients {
				if got := keySlot(ClientKey(prefix, client)); got != want {
					t.Errorf("prefix %q: client %q key %q is in slot %d, the cluster key in %d", prefix, client, ClientKey(prefix, client), got, want)
				}
			}
		}
	})

	t.Run("cluster keyslot on the real cluster agrees", func(t *testing.T) {
		t.Parallel()
		rdb := testenv.RedisCluster(t)
		ctx := testenv.Context(t)
		keys := []string{"123456789", ClusterKey(config.Default().Redis.KeyPrefix), ClusterKey(testenv.Prefix(t))}
		for _, client := range clients {
			keys = append(keys, ClientKey(config.Default().Redis.KeyPrefix, client))
		}
		for _, key := range keys {
			got, err := rdb.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
			}
			if int(got) != keySlot(key) {
				t.Errorf("CLUSTER KEYSLOT %q = %d, ours %d", key, got, keySlot(key))
			}
		}
	})

	t.Run("the script runs on the cluster with both keys", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testenv.RedisCluster(t), enabled(space.Rate{RefillRPS: neverRefills, Burst: 4}))
		d := b.admit("acme", rate(neverRefills, 2))
		if !d.Admitted || !near(d.Cluster.Remaining, 3, 1e-6) || !near(d.Client.Remaining, 1, 1e-6) {
			t.Fatalf("decision = %+v (client %+v), want admitted with 3 and 1 left", d, d.Client)
		}
		if !b.stored(b.clusterKey()).exists || !b.stored(b.clientKey("acme")).exists {
			t.Fatal("the script did not write both keys")
		}
		// The cluster does check: the same script over keys of two slots is refused.
		other := "x" + b.clientKey("acme")[1:] // no hash tag any more
		if keySlot(other) == keySlot(b.clusterKey()) {
			t.Fatalf("test key %q happens to share the slot", other)
		}
		err := bucketScript.Run(b.ctx, b.rdb, []string{b.clusterKey(), other}, take, "1", "1", "1", "1").Err()
		if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
			t.Fatalf("keys of two slots: %v, want CROSSSLOT", err)
		}
	})
}
