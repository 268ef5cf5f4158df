-- Release a lock only if the caller still holds it, and announce it if
-- someone waits.
-- KEYS[1] the lock; KEYS[2] (optional) its waiting flag, set by waiters that
-- found it held; ARGV[1] the holder's token; ARGV[2], ARGV[3] (with KEYS[2])
-- the channel and message that tell waiters the lock is free.
-- Returns 0 if the caller did not hold it, 1 if released, 2 if released and
-- announced to a waiter.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- The lock and its flag go in one DEL: the lock is there, so a count of 2
-- says the flag was there too.
if redis.call('DEL', unpack(KEYS)) == 2 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 2
end
return 1
