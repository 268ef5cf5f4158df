-- Record a Redlock holder's fencing token on one node, while it holds the
-- node's share of the lock.
-- KEYS[1] the lock, KEYS[2] the key's fencing counter; ARGV[1] the holder's
-- random token, ARGV[2] its fencing token.
-- Returns 1 if the counter now is at least the fencing token, 0 if the
-- caller does not hold the lock on this node.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local n = tonumber(redis.call('GET', KEYS[2])) or 0
if n < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
