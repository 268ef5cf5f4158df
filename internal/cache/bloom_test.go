package cache

import (
	"testing"
)

// The Cluster specification's CRC16 check value: "123456789" is 0x31C3,
// slot 12739 (what CLUSTER KEYSLOT answers too; TestBloomShardsOnEveryMaster
// asks a real Cluster about the shards' own tags).
func TestKeySlot(t *testing.T) {
	if got := keySlot("123456789"); got != 0x31C3%clusterSlots {
		t.Fatalf("keySlot(123456789) = %d, want %d", got, 0x31C3%clusterSlots)
	}
}

// Each shard's tag falls in its own n-th of the slot space, so that the
// shards spread over the masters of a Cluster as evenly as n allows.
func TestShardTagsSpreadOverSlots(t *testing.T) {
	if tag := shardTag(0, 1); tag != "bloom" {
		t.Fatalf("the one shard's tag is %q, want the unsharded layout's %q", tag, "bloom")
	}
	for _, n := range []int{2, 3, DefaultBloomShards, MaxBloomShards} {
		seen := map[string]bool{}
		for i := range n {
			tag := shardTag(i, n)
			slot := int(keySlot(tag))
			if lo, hi := i*clusterSlots/n, (i+1)*clusterSlots/n; slot < lo || slot >= hi {
				t.Errorf("shard %d of %d: tag %q in slot %d, want [%d, %d)", i, n, tag, slot, lo, hi)
			}
			if seen[tag] {
				t.Errorf("shard %d of %d: tag %q taken twice", i, n, tag)
			}
			seen[tag] = true
		}
	}
}

// Split in shards, each sized for its own ids, the filter lets absent ids
// through at the configured rate, as one filter does, in as many bits; and
// the ids spread evenly over the shards.
func TestShardedFalsePositiveRate(t *testing.T) {
	t.Parallel()
	const (
		ids    = 20_000
		absent = 400_000
		fp     = 0.001
	)
	for _, n := range []int{1, 3, DefaultBloomShards} {
		f := newBloomFilter(nil, "x:", fp, n)
		own := map[*bloomShard][]int64{}
		for id := int64(1); id <= ids; id++ {
			s := f.shardOf(id)
			own[s] = append(own[s], id)
		}
		type built struct {
			p      bloomParams
			bitmap []byte
		}
		filters := map[*bloomShard]built{}
		var bits uint64
		for _, s := range f.shards {
			if got, even := len(own[s]), ids/n; got < even*9/10 || got > even*11/10 {
				t.Errorf("%d shards: %s holds %d ids, want %d ± 10%%", n, s.bits, got, even)
			}
			p, bitmap := bitmapOf(own[s], fp)
			filters[s] = built{p, bitmap}
			bits += p.m
		}
		has := func(id int64) bool {
			b := filters[f.shardOf(id)]
			for _, pos := range b.p.positions(id) {
				if b.bitmap[pos/8]&(0x80>>(pos%8)) == 0 {
					return false
				}
			}
			return true
		}
		for id := int64(1); id <= ids; id++ {
			if !has(id) {
				t.Fatalf("%d shards: id %d turned away", n, id)
			}
		}
		passed := 0
		for id := int64(ids + 1); id <= ids+absent; id++ {
			if has(id) {
				passed++
			}
		}
		rate := float64(passed) / absent
		t.Logf("%d shards: %d bits for %d ids, %d of %d absent ids passed (%.5f; configured %.3f)", n, bits, ids, passed, absent, rate, fp)
		if rate < fp/2 || rate > fp*2 {
			t.Errorf("%d shards: false-positive rate %.5f, want about %.3f", n, rate, fp)
		}
		if one, _ := bitmapOf(make([]int64, ids), fp); float64(bits) > float64(one.m)*1.05 {
			t.Errorf("%d shards take %d bits, one filter %d", n, bits, one.m)
		}
	}
}
