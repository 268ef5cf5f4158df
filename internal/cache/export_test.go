package cache

import "context"

// RebuildBloom runs the rebuild of a missing Bloom filter in the caller's
// goroutine, so that a test can interleave it with a reset step by step.
func (p *Products) RebuildBloom(ctx context.Context) error { return p.rebuildBloom(ctx) }
