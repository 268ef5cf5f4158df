-- Release a lock only if the caller still holds it, and announce it.
-- KEYS[1] the lock; ARGV[1] the holder's token; ARGV[2], ARGV[3] (optional)
-- the channel and message that tell waiters the lock is free.
-- Returns 1 if released.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
