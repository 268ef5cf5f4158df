-- Restart a lost fencing counter from the server's clock, for the holder
-- that found it lost (its INCR came back small).
-- KEYS[1] the key's fencing counter.
-- Returns the holder's token: above the counter and above the clock in
-- microseconds, so above every token a database has seen before the loss.
local t = redis.call('TIME')
local now = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
if (tonumber(redis.call('GET', KEYS[1])) or 0) < now then
  redis.call('SET', KEYS[1], now)
end
return redis.call('INCR', KEYS[1])
