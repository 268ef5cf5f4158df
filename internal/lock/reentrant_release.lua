-- Release one acquisition of a reentrant lock; the last frees it and
-- announces it if someone waits.
-- KEYS[1] the lock; KEYS[2] (optional) its waiting flag; ARGV[1] the owner;
-- ARGV[2] the hold's id, or '' for whichever hold the acquisition is in (the
-- clean-up of an acquisition whose reply was lost); ARGV[3] the
-- acquisition's id; ARGV[4], ARGV[5] (with KEYS[2]) the channel and message
-- that tell waiters the lock is free.
-- Returns the depth left (0: freed), or -1 when the acquisition is not in
-- the owner's hold: the hold ended (expired, lost) — a later hold of the
-- same owner is another hold — or the acquisition was released already.
local h = redis.call('HMGET', KEYS[1], 'owner', 'hold')
if h[1] ~= ARGV[1] or (ARGV[2] ~= '' and h[2] ~= ARGV[2]) then
  return -1
end
if redis.call('HDEL', KEYS[1], 'acq:' .. ARGV[3]) == 0 then
  return -1
end
local depth = redis.call('HINCRBY', KEYS[1], 'depth', -1)
if depth > 0 then
  return depth
end
-- The lock and its flag go in one DEL: the lock is there, so a count of 2
-- says the flag was there too.
if redis.call('DEL', unpack(KEYS)) == 2 then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return 0
