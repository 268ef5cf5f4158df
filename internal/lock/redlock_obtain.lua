-- Take a Redlock node's share of a lock, and read the key's fencing counter
-- (clock_us is fence.lua's, prepended).
-- KEYS[1] the lock, KEYS[2] its waiting flag, KEYS[3] (optional) the key's
-- fencing counter, all in one hash slot; ARGV[1] the holder's random token,
-- ARGV[2] the lease length in ms, ARGV[3] '1' when the caller waits for the
-- lock and releases are announced.
-- Returns max(this node's counter, its clock in microseconds) — the caller
-- takes the maximum over a majority and adds one — 0 without a counter, or
-- -1 when the lock is held by someone else: then, with ARGV[3] = '1', the
-- lock is flagged as waited for on this node, so that its release here is
-- announced.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then
    redis.call('SET', KEYS[2], 1, 'PX', ARGV[2])
  end
  return -1
end
if KEYS[3] then
  return math.max(tonumber(redis.call('GET', KEYS[3])) or 0, clock_us())
end
return 0
