-- Take a Redlock node's share of a lock, and read the key's fencing counter.
-- KEYS[1] the lock, KEYS[2] the key's fencing counter (same hash slot);
-- without KEYS[2] the lock is taken without a token
-- ARGV[1] the holder's random token, ARGV[2] the lease length in ms
-- Returns this node's counter (the caller takes the maximum over a majority
-- and raises it by one), 0 when taken without a token, or -1 when the lock
-- is held by someone else. Counters are Lua numbers, exact below 2^53, which
-- a clock in microseconds stays under until the year 2255.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1
end
if #KEYS < 2 then
  return 0
end
local n = tonumber(redis.call('GET', KEYS[2]))
if not n then
  -- A node restarted empty starts from its clock in microseconds, past any
  -- token the database has seen, rather than from zero.
  local t = redis.call('TIME')
  n = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
  redis.call('SET', KEYS[2], n)
end
return n
