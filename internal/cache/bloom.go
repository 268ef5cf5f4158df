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
// The bitmap uses Redis bit order (offset 0 is the high bit of the first
// byte), so the check script reads it with GETBIT. A build computes the whole
// bitmap here and swaps it in with one script, rather than sending n·k
// SETBITs to a live key: readers never see a half-built filter, which would
// turn away products that exist.
//
// Builders race: a reset after every change of the catalog, and a rebuild
// when the filter is missing. A filter built from ids read before a change
// must never be the last one swapped in, or the products the change added
// are turned away for good. So an epoch (a counter) sits beside the filter:
// a reset takes a new one (INCR) before it reads the ids, a rebuild reads the
// current one before it reads the ids, and the swap happens only if the
// epoch is still the builder's. Every change of the catalog is followed by a
// reset, whose INCR comes after the change; a swap that succeeds saw no INCR
// since its builder's epoch, so its builder read the ids after every change
// whose reset had begun by then — and a change whose reset begins later is
// covered by that reset's own swap, which the older builders can no longer
// undo. Two resets: the later INCR wins and the earlier one's swap, if it
// comes last, is refused. The epoch never expires; lost with the filter (a
// Redis restarted empty), a rebuild reads none and swaps unless a reset has
// taken one since.
type bloomFilter struct {
	rdb        redis.Cmdable
	bits, meta string // the bitmap and its parameters
	epoch      string // bumped by every reset, see above
	nextPrefix string // where a build writes before the swap
	fp         float64
	// params are the parameters last seen in Redis; a check that finds
	// others is told them and tries again.
	params atomic.Pointer[bloomParams]
}

func newBloomFilter(rdb redis.Cmdable, prefix string, fp float64) *bloomFilter {
	tag := prefix + "{bloom}"
	return &bloomFilter{rdb: rdb, bits: tag, meta: tag + ":params", epoch: tag + ":epoch", nextPrefix: tag + ":next:", fp: fp}
}

// errNoFilter means Redis holds no filter (never built, or Redis lost it).
var errNoFilter = errors.New("cache: no bloom filter")

// mayContain reports whether id may be a product: false means certainly
// not. It returns errNoFilter when there is no filter to ask.
func (f *bloomFilter) mayContain(ctx context.Context, id int64) (bool, error) {
	for range 2 {
		res, err := bloomCheckScript.Run(ctx, f.rdb, f.keys(), f.args(id)...).Result()
		if ok, retry, err := f.verdict(res, err); !retry {
			return ok, err
		}
	}
	return false, errors.New("cache: bloom filter parameters keep changing")
}

// check queues the question of mayContain on pipe, so that it travels with
// other commands; answer reads the reply.
func (f *bloomFilter) check(ctx context.Context, pipe redis.Pipeliner, id int64) *redis.Cmd {
	return bloomCheckScript.EvalSha(ctx, pipe, f.keys(), f.args(id)...)
}

// answer is mayContain's result from the reply of a check. A script the
// server does not know yet, or a filter rebuilt with other parameters, is
// asked again on its own.
func (f *bloomFilter) answer(ctx context.Context, cmd *redis.Cmd, id int64) (bool, error) {
	res, err := cmd.Result()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		return f.mayContain(ctx, id)
	}
	ok, retry, err := f.verdict(res, err)
	if retry {
		return f.mayContain(ctx, id)
	}
	return ok, err
}

func (f *bloomFilter) keys() []string { return []string{f.bits, f.meta} }

// args are the check script's arguments: the parameters last seen, and id's
// positions under them.
func (f *bloomFilter) args(id int64) []any {
	params := bloomParams{m: 1, k: 1}
	if p := f.params.Load(); p != nil {
		params = *p
	}
	args := []any{params.String()}
	for _, pos := range params.positions(id) {
		args = append(args, pos)
	}
	return args
}

// verdict reads the check script's reply. retry means the filter has other
// parameters than the positions were computed for; they are stored now.
func (f *bloomFilter) verdict(res any, err error) (ok, retry bool, _ error) {
	if err != nil {
		return false, false, fmt.Errorf("%w: bloom filter: %w", errRedis, err)
	}
	switch v := res.(type) {
	case int64:
		if v < 0 {
			return false, false, errNoFilter
		}
		return v == 1, false, nil
	case string:
		p, err := parseBloomParams(v)
		if err != nil {
			return false, false, err
		}
		f.params.Store(&p)
		return false, true, nil
	}
	return false, false, fmt.Errorf("cache: bloom filter: unexpected reply %v", res)
}

// newEpoch takes a new epoch, for a reset that is about to read the ids.
func (f *bloomFilter) newEpoch(ctx context.Context) (string, error) {
	n, err := f.rdb.Incr(ctx, f.epoch).Result()
	if err != nil {
		return "", fmt.Errorf("cache: bloom filter epoch: %w", err)
	}
	return strconv.FormatInt(n, 10), nil
}

// currentEpoch reads the epoch, for a rebuild that is about to read the
// ids; "" when no reset has taken one.
func (f *bloomFilter) currentEpoch(ctx context.Context) (string, error) {
	s, err := f.rdb.Get(ctx, f.epoch).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("cache: bloom filter epoch: %w", err)
	}
	return s, nil
}

// build replaces the filter with one over ids, sized so that an id not
// among them passes with probability fp — if epoch, which the caller took
// or read before reading ids, is still the current one. swapped is false
// when a reset has taken a newer epoch meanwhile: its filter, from ids read
// later, stands.
func (f *bloomFilter) build(ctx context.Context, ids []int64, epoch string) (swapped bool, _ error) {
	m, k := bloom.EstimateParameters(uint(max(len(ids), 1)), f.fp)
	p := bloomParams{m: uint64(m), k: uint64(k)}
	bitmap := make([]byte, (p.m+7)/8)
	for _, id := range ids {
		for _, pos := range p.positions(id) {
			bitmap[pos/8] |= 0x80 >> (pos % 8)
		}
	}
	next := f.nextPrefix + rand.Text()
	// The new bitmap expires if this build dies before the swap.
	if err := f.rdb.Set(ctx, next, bitmap, time.Minute).Err(); err != nil {
		return false, fmt.Errorf("cache: build bloom filter: %w", err)
	}
	n, err := bloomSwapScript.Run(ctx, f.rdb, []string{next, f.bits, f.meta, f.epoch}, p.String(), epoch).Int64()
	if err != nil {
		return false, fmt.Errorf("cache: build bloom filter: %w", err)
	}
	if n == 1 {
		f.params.Store(&p)
	}
	return n == 1, nil
}
