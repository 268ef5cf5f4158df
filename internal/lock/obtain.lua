-- Take a lock in one Redis and hand out its fencing token.
-- KEYS[1] the lock, KEYS[2] its fencing counter (same hash slot), KEYS[3]
-- (optional) its waiting flag; ARGV[1] the holder's random token, ARGV[2]
-- the lease length in ms, ARGV[3] the counter below which it was lost.
-- Returns the fencing token, or -1 when the lock is held by someone else:
-- then, with KEYS[3], the lock is flagged as waited for, so that its
-- release is announced.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if KEYS[3] then
    redis.call('SET', KEYS[3], 1, 'PX', ARGV[2])
  end
  return -1
end
local n = redis.call('INCR', KEYS[2])
if n < tonumber(ARGV[3]) then
  -- Lost (first use, a Redis restarted empty, an eviction): restart from
  -- the server's clock in microseconds, above any token handed out before.
  local t = redis.call('TIME')
  local now = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
  if n < now then
    redis.call('SET', KEYS[2], now)
    n = redis.call('INCR', KEYS[2])
  end
end
return n
