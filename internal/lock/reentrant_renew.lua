-- Extend a reentrant lock's lease, the whole hold, if the owner holds it.
-- KEYS[1] the lock; ARGV[1] the owner; ARGV[2] the lease length in ms.
-- Returns 1 if extended.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
