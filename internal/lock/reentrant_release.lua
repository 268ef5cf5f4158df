-- Release one acquisition of a reentrant lock; the last frees it and
-- announces it if someone waits.
-- KEYS[1] the lock; KEYS[2] (optional) its waiting flag; ARGV[1] the owner;
-- ARGV[2], ARGV[3] (with KEYS[2]) the channel and message that tell waiters
-- the lock is free.
-- Returns the depth left (0: freed), or -1 when the owner does not hold it.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return -1
end
local depth = redis.call('HINCRBY', KEYS[1], 'depth', -1)
if depth > 0 then
  return depth
end
redis.call('DEL', KEYS[1])
if KEYS[2] and redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 0
