package cache

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/redis/go-redis/v9"
)

// bloomParams are a filter's size in bits (m) and number of hash positions
// per id (k). Their text form "m:k" is stored beside the bitmap.
type bloomParams struct{ m, k uint64 }

func (p bloomParams) String() string { return fmt.Sprintf("%d:%d", p.m, p.k) }

func parseBloomParams(s string) (bloomParams, error) {
	m, k, ok := strings.Cut(s, ":")
	var p bloomParams
	var err1, err2 error
	p.m, err1 = strconv.ParseUint(m, 10, 64)
	p.k, err2 = strconv.ParseUint(k, 10, 64)
	if !ok || err1 != nil || err2 != nil || p.m == 0 || p.k == 0 {
		return bloomParams{}, fmt.Errorf("cache: bad bloom filter parameters %q", s)
	}
	return p, nil
}

// positions returns id's bit positions in a filter of parameters p. The k
// hashes are bits-and-blooms' (128-bit murmur3, double hashing) of the id's
// 8 big-endian bytes.
func (p bloomParams) positions(id int64) []uint64 {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(id))
	locs := bloom.Locations(b[:], uint(p.k))
	for i := range locs {
		locs[i] %= p.m
	}
	return locs
}

// bloomFilter is a Bloom filter over the ids of existing products, kept in
// Redis so that every replica consults the same one.
//
// It is split into shards, each a whole Bloom filter over the ids a hash
// sends to it (see shardOf), with its own bitmap, parameters and epoch under
// a hash tag of its own. On a Redis Cluster every product read asks the
// filter, and one tag would send every check in the fleet to the one master
// that serves its slot; the shards' tags are chosen so that their slots
// spread evenly over the slot space (see shardTag), and so over the masters.
// A check asks the one shard of its id: one script, one slot. Each shard is
// sized for its own ids at the configured false-positive rate, so an absent
// id passes with that probability whatever its shard, and the shards
// together take as many bits as one filter would.
//
// The bitmap uses Redis bit order (offset 0 is the high bit of the first
// byte), so the check script reads it with GETBIT. A build computes a
// shard's whole bitmap here and swaps it in with one script, rather than
// sending n·k SETBITs to a live key: readers never see a half-built shard,
// which would turn away products that exist. A build swaps its shards one
// after the other, so for a moment some shards may be the new build's and
// some the old one's; that is harmless, as every id is only ever checked in
// its own shard, and each shard is whole.
//
// Builders race: a reset after every change of the catalog, and a rebuild
// when the filter is missing. A filter built from ids read before a change
// must never be the last one swapped in, or the products the change added
// are turned away for good. So an epoch (a counter) sits beside each shard:
// a reset takes a new one (INCR) before it reads the ids, a rebuild reads the
// current one before it reads the ids, and the swap happens only if the
// epoch is still the builder's. Every change of the catalog is followed by a
// reset, whose INCR comes after the change; a swap that succeeds saw no INCR
// since its builder's epoch, so its builder read the ids after every change
// whose reset had begun by then — and a change whose reset begins later is
// covered by that reset's own swap, which the older builders can no longer
// undo. Two resets: the later INCR wins and the earlier one's swap, if it
// comes last, is refused. The rule holds shard by shard (the INCR, the swap
// and the check of one shard are on its slot): a reset takes a new epoch of
// every shard before it reads the ids, so a swap may succeed on some shards
// and be refused on others — those a later reset has reached, and will swap
// itself. The epoch never expires; lost with its shard (a Redis, or the
// Cluster master of the shard's slot, restarted empty), a rebuild reads
// none and swaps unless a reset has taken one since. A shard missing while
// others exist lets every id of its own through, and is rebuilt alone.
//
// The epochs above order the builders; they cannot tell a reader that the
// catalog changed and no reset followed (Redis failed right after a seed
// committed): the old shards would stand, and turn away the new products,
// for good. So each shard also records the catalog's epoch (a count of the
// catalog's resets, which MySQL keeps and each seed raises in its own
// transaction) that its ids were read at, in the same snapshot as the ids.
// A shard whose catalog epoch is not the catalog's current one is no
// filter to its readers — the ids it turns away go on to the cache and
// MySQL, as with no filter — and is rebuilt. Readers learn the catalog's
// epoch from MySQL at most once a second (see Products.trusted).
type bloomFilter struct {
	rdb    redis.Cmdable
	shards []*bloomShard
	fp     float64
}

// bloomShard is one shard's keys, which share a hash tag, and the
// parameters last seen in Redis; a check that finds others is told them and
// tries again.
type bloomShard struct {
	bits, meta string // the bitmap and its parameters
	epoch      string // bumped by every reset, see bloomFilter
	catalog    string // the catalog epoch the bitmap was built from
	nextPrefix string // where a build writes before the swap
	params     atomic.Pointer[bloomParams]
	// copy is this replica's copy of the shard, nil when it keeps none
	// (see bloomCopy).
	copy atomic.Pointer[bloomCopy]
}

// newBloomFilter is a filter of n shards under prefix, which must hold no
// '{': the shards' own hash tags must decide their slots.
func newBloomFilter(rdb redis.Cmdable, prefix string, fp float64, n int) *bloomFilter {
	f := &bloomFilter{rdb: rdb, fp: fp}
	for i := range n {
		tag := prefix + "{" + shardTag(i, n) + "}"
		f.shards = append(f.shards, &bloomShard{bits: tag, meta: tag + ":params", epoch: tag + ":epoch", catalog: tag + ":catalog",
			nextPrefix: tag + ":next:"})
	}
	return f
}

// clusterSlots is the size of a Redis Cluster's slot space.
const clusterSlots = 16384

// shardTag returns the hash tag of shard i of n: "bloom" for one shard (the
// layout of an unsharded filter), and otherwise "bloom:i/n:j", with the
// smallest j whose slot falls in the i-th n-th of the slot space. A Cluster
// made by `redis-cli --cluster create` gives each master a contiguous, even
// range of slots, so n shards spread over its masters as evenly as n allows;
// tags left to chance would leave some masters more shards, or none. The
// shard count is in the tag: replicas that disagree on it use separate
// filters, never one whose shards hold other ids than they expect.
func shardTag(i, n int) string {
	if n == 1 {
		return "bloom"
	}
	lo, hi := i*clusterSlots/n, (i+1)*clusterSlots/n
	for j := 0; ; j++ {
		tag := fmt.Sprintf("bloom:%d/%d:%d", i, n, j)
		if s := int(keySlot(tag)); s >= lo && s < hi {
			return tag
		}
	}
}

// keySlot is the Cluster slot of a key with no hash tag: CRC16 (XMODEM,
// as the Cluster specification has it) modulo the slot count.
func keySlot(key string) uint16 {
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % clusterSlots
}

// shardOf returns the shard that holds id. The hash (splitmix64's
// finaliser) is not the filter's own (murmur3), so that the ids of one
// shard spread over its bitmap as any ids would.
func (f *bloomFilter) shardOf(id int64) *bloomShard {
	z := uint64(id)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return f.shards[z%uint64(len(f.shards))]
}

// errNoFilter means Redis holds no filter for an id (never built, or Redis
// lost its shard).
var errNoFilter = errors.New("cache: no bloom filter")

// bloomVerdict is a shard's answer about an id.
type bloomVerdict struct {
	// maybe is false when the id is certainly not among the ids the shard
	// was built from.
	maybe bool
	// catalog is, when maybe is false, the catalog epoch those ids are of;
	// -1 when the shard's builder recorded none (a replica of an older
	// version).
	catalog int64
}

// mayContain asks id's shard whether id may be a product. It returns
// errNoFilter when there is no filter to ask.
func (f *bloomFilter) mayContain(ctx context.Context, id int64) (bloomVerdict, error) {
	s := f.shardOf(id)
	for range 2 {
		res, err := bloomCheckScript.Run(ctx, f.rdb, s.keys(), s.args(id)...).Result()
		if v, retry, err := s.verdict(res, err); !retry {
			return v, err
		}
	}
	return bloomVerdict{}, errors.New("cache: bloom filter parameters keep changing")
}

// check queues the question of mayContain on pipe, so that it travels with
// other commands; answer reads the reply.
func (f *bloomFilter) check(ctx context.Context, pipe redis.Pipeliner, id int64) *redis.Cmd {
	s := f.shardOf(id)
	return bloomCheckScript.EvalSha(ctx, pipe, s.keys(), s.args(id)...)
}

// answer is mayContain's result from the reply of a check. A script the
// server does not know yet, or a shard rebuilt with other parameters, is
// asked again on its own.
func (f *bloomFilter) answer(ctx context.Context, cmd *redis.Cmd, id int64) (bloomVerdict, error) {
	res, err := cmd.Result()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		return f.mayContain(ctx, id)
	}
	v, retry, err := f.shardOf(id).verdict(res, err)
	if retry {
		return f.mayContain(ctx, id)
	}
	return v, err
}

func (s *bloomShard) keys() []string { return []string{s.bits, s.meta, s.catalog} }

// args are the check script's arguments: the parameters last seen, and id's
// positions under them.
func (s *bloomShard) args(id int64) []any {
	params := bloomParams{m: 1, k: 1}
	if p := s.params.Load(); p != nil {
		params = *p
	}
	args := []any{params.String()}
	for _, pos := range params.positions(id) {
		args = append(args, pos)
	}
	return args
}

// verdict reads the check script's reply. retry means the shard has other
// parameters than the positions were computed for; they are stored now.
func (s *bloomShard) verdict(res any, err error) (_ bloomVerdict, retry bool, _ error) {
	if err != nil {
		return bloomVerdict{}, false, fmt.Errorf("%w: bloom filter: %w", errRedis, err)
	}
	switch v := res.(type) {
	case int64:
		if v < 0 {
			return bloomVerdict{}, false, errNoFilter
		}
		return bloomVerdict{maybe: true}, false, nil
	case []any: // {0, the catalog epoch}
		if len(v) == 2 {
			epoch, _ := v[1].(string)
			return bloomVerdict{catalog: parseCatalogEpoch(epoch)}, false, nil
		}
	case string:
		p, err := parseBloomParams(v)
		if err != nil {
			return bloomVerdict{}, false, err
		}
		s.params.Store(&p)
		return bloomVerdict{}, true, nil
	}
	return bloomVerdict{}, false, fmt.Errorf("cache: bloom filter: unexpected reply %v", res)
}

// parseCatalogEpoch reads a shard's catalog epoch: -1 for none, or for one
// that is not a number, which no reader's catalog has.
func parseCatalogEpoch(s string) int64 {
	epoch, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return epoch
}

// epochs is one epoch per shard, as a builder took or read them.
type epochs []string

// newEpochs takes a new epoch of every shard, for a reset that is about to
// read the ids.
func (f *bloomFilter) newEpochs(ctx context.Context) (epochs, error) {
	pipe := f.rdb.Pipeline()
	incrs := make([]*redis.IntCmd, len(f.shards))
	for i, s := range f.shards {
		incrs[i] = pipe.Incr(ctx, s.epoch)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("cache: bloom filter epoch: %w", err)
	}
	e := make(epochs, len(incrs))
	for i, c := range incrs {
		e[i] = strconv.FormatInt(c.Val(), 10)
	}
	return e, nil
}

// currentEpochs reads every shard's epoch, for a rebuild that is about to
// read the ids; "" for a shard of which no reset has taken one.
func (f *bloomFilter) currentEpochs(ctx context.Context) (epochs, error) {
	pipe := f.rdb.Pipeline()
	gets := make([]*redis.StringCmd, len(f.shards))
	for i, s := range f.shards {
		gets[i] = pipe.Get(ctx, s.epoch)
	}
	_, _ = pipe.Exec(ctx) // each command keeps its own error
	e := make(epochs, len(gets))
	for i, c := range gets {
		if !replied(c) {
			return nil, fmt.Errorf("cache: bloom filter epoch: %w", c.Err())
		}
		e[i] = c.Val()
	}
	return e, nil
}

// outdated returns the shards that are no filter of the catalog at epoch
// catalog: those Redis holds no whole filter of (no bitmap or no
// parameters), and those built from another catalog epoch.
func (f *bloomFilter) outdated(ctx context.Context, catalog int64) ([]int, error) {
	pipe := f.rdb.Pipeline()
	exists := make([]*redis.IntCmd, len(f.shards))
	built := make([]*redis.StringCmd, len(f.shards))
	for i, s := range f.shards {
		exists[i] = pipe.Exists(ctx, s.bits, s.meta)
		built[i] = pipe.Get(ctx, s.catalog)
	}
	_, _ = pipe.Exec(ctx) // each command keeps its own error
	var outdated []int
	for i := range f.shards {
		if !replied(exists[i]) || !replied(built[i]) {
			return nil, fmt.Errorf("cache: bloom filter: %w", errors.Join(exists[i].Err(), built[i].Err()))
		}
		if exists[i].Val() < 2 || parseCatalogEpoch(built[i].Val()) != catalog {
			outdated = append(outdated, i)
		}
	}
	return outdated, nil
}

// all is the index of every shard.
func (f *bloomFilter) all() []int {
	all := make([]int, len(f.shards))
	for i := range all {
		all[i] = i
	}
	return all
}

// build replaces the given shards with filters over their share of ids,
// which are the catalog's at epoch catalog, each sized so that an id not
// among them passes with probability fp — each if its epoch, which the
// caller took or read before reading ids, is still the current one. It
// returns how many it swapped in; a shard is not when a reset has taken a
// newer epoch of it meanwhile: that reset's filter, from ids read later,
// stands. A shard that fails does not stop the others: each one swapped in
// is fresher than the one it replaces.
func (f *bloomFilter) build(ctx context.Context, ids []int64, catalog int64, e epochs, shards []int) (swapped int, _ error) {
	own := make(map[*bloomShard][]int64, len(f.shards))
	for _, id := range ids {
		s := f.shardOf(id)
		own[s] = append(own[s], id)
	}
	var errs []error
	for _, i := range shards {
		s := f.shards[i]
		ok, err := f.buildShard(ctx, s, own[s], catalog, e[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("cache: build bloom filter shard %s: %w", s.bits, err))
		}
		if ok {
			swapped++
		}
	}
	return swapped, errors.Join(errs...)
}

// buildShard swaps a filter over ids, of the catalog at epoch catalog, in
// for shard s if epoch is still its epoch, and reports whether it did.
func (f *bloomFilter) buildShard(ctx context.Context, s *bloomShard, ids []int64, catalog int64, epoch string) (bool, error) {
	p, bitmap := bitmapOf(ids, f.fp)
	next := s.nextPrefix + rand.Text()
	// The new bitmap expires if this build dies before the swap.
	if err := f.rdb.Set(ctx, next, bitmap, time.Minute).Err(); err != nil {
		return false, err
	}
	n, err := bloomSwapScript.Run(ctx, f.rdb, []string{next, s.bits, s.meta, s.epoch, s.catalog}, p.String(), epoch, catalog).Int64()
	if err != nil {
		return false, err
	}
	if n == 1 {
		s.params.Store(&p)
	}
	return n == 1, nil
}

// bitmapOf is a filter over ids, sized so that an id not among them passes
// with probability fp: its parameters and its bitmap, in Redis bit order.
func bitmapOf(ids []int64, fp float64) (bloomParams, []byte) {
	m, k := bloom.EstimateParameters(uint(max(len(ids), 1)), fp)
	p := bloomParams{m: uint64(m), k: uint64(k)}
	bitmap := make([]byte, (p.m+7)/8)
	for _, id := range ids {
		for _, pos := range p.positions(id) {
			bitmap[pos/8] |= 0x80 >> (pos % 8)
		}
	}
	return p, bitmap
}
