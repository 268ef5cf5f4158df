-- Take a Redlock node's share of a lock, and read the key's fencing counter
-- (clock_us is fence.lua's, prepended).
-- KEYS[1] the lock, KEYS[2] the key's fencing counter (same hash slot);
-- without KEYS[2] the lock is taken without a token
-- ARGV[1] the holder's random token, ARGV[2] the lease length in ms
-- Returns max(this node's counter, its clock in microseconds) — the caller
-- takes the maximum over a majority and adds one — 0 when taken without a
-- token, or -1 when the lock is held by someone else.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1
end
if #KEYS < 2 then
  return 0
end
return math.max(tonumber(redis.call('GET', KEYS[2])) or 0, clock_us())
