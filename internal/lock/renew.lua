-- Extend a lock's lease only if the caller still holds it.
-- KEYS[1] the lock; ARGV[1] the holder's token; ARGV[2] the lease length in ms.
-- Returns 1 if extended.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
