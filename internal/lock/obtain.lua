-- Obtain a lock and its fencing token in one step.
-- KEYS[1] the lock, KEYS[2] the key's fencing counter (same hash slot);
-- without KEYS[2] the lock is taken without a token
-- ARGV[1] the holder's random token, ARGV[2] the lease length in ms
-- Returns the new fencing token, 0 when taken without a token, or -1 when
-- the lock is held by someone else.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1
end
if #KEYS < 2 then
  return 0
end
-- A counter that is missing (first use, or a Redis restarted empty) starts
-- from the server's clock in microseconds rather than from zero, so tokens
-- keep growing past any token a database has already seen.
if redis.call('EXISTS', KEYS[2]) == 0 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
end
return redis.call('INCR', KEYS[2])
