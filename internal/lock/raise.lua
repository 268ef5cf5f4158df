-- Raise a fencing counter to at least a value; never lower it.
-- KEYS[1] the counter; ARGV[1] the value.
-- Returns 1.
if (tonumber(redis.call('GET', KEYS[1])) or 0) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
