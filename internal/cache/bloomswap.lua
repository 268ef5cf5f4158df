-- Put a freshly built bitmap in place of the filter, atomically.
-- KEYS[1] the new bitmap, KEYS[2] the filter's bitmap, KEYS[3] its
-- parameters (same hash slot)
-- ARGV[1] the new parameters "m:k"
-- Readers see the old filter or the new one, never a half-built one.
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('PERSIST', KEYS[2])
redis.call('SET', KEYS[3], ARGV[1])
return 1
