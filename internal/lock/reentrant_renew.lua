-- Extend a reentrant lock's lease, the whole hold, if it is still the
-- owner's same hold.
-- KEYS[1] the lock; ARGV[1] the owner; ARGV[2] the hold's id; ARGV[3] the
-- lease length in ms.
-- Returns 1 if extended.
local h = redis.call('HMGET', KEYS[1], 'owner', 'hold')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0
