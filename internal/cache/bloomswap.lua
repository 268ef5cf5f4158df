-- Put a freshly built bitmap in place of a shard of the filter, atomically,
-- unless the catalog may have changed since the builder read its ids.
-- KEYS[1] the new bitmap, KEYS[2] the shard's bitmap, KEYS[3] its
-- parameters, KEYS[4] the shard's epoch, KEYS[5] the catalog epoch its
-- bitmap was built from (same hash slot)
-- ARGV[1] the new parameters "m:k", ARGV[2] the epoch the builder took or
-- read before reading the ids ('' for none), ARGV[3] the catalog epoch the
-- builder's ids are of
-- Returns 1 when swapped. 0 when the epoch has moved on: a reset that read
-- the ids later has taken a newer one, and its filter stands or is on its
-- way; the new bitmap is dropped.
-- Readers see the old filter or the new one, never a half-built one.
if (redis.call('GET', KEYS[4]) or '') ~= ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('PERSIST', KEYS[2])
redis.call('SET', KEYS[3], ARGV[1])
redis.call('SET', KEYS[5], ARGV[3])
return 1
