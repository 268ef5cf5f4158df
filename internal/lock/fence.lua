-- How a fencing token is drawn; prepended to the scripts that draw one.
--
-- A token is max(counter + 1, the server's clock in microseconds), a hybrid
-- logical clock. The counter alone goes back when Redis loses it: a restart
-- without persistence, a restore from an older snapshot, a promoted replica
-- that missed the latest INCRs. The clock keeps every token at least its
-- time of issue, so tokens stay above every one issued before as long as
-- the server's clock moves forward; where it cannot (a replica promoted on
-- a machine whose clock is behind), RaiseFence repairs the counter (the
-- Redis lock and Redlock have it; the reentrant lock does not). Lua
-- numbers are exact below 2^53, which microseconds stay under until the
-- year 2255.

-- clock_us is the server's clock in microseconds.
local function clock_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- next_fence draws the next token from the counter at key and stores it
-- there, so that the next one is larger even if the clock steps back.
local function next_fence(key)
  local n = math.max((tonumber(redis.call('GET', key)) or 0) + 1, clock_us())
  redis.call('SET', key, string.format('%.0f', n))
  return n
end
