package stock

// SweepShards is how many shards the sweep splits the SKUs into, for tests
// that place SKUs in one.
const SweepShards = sweepShards
