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
-- there, so that the next one is larger even if the clock steps back. It
-- writes the clock and reads the counter's old value in one SET … GET: the
-- clock is ahead of the counter on every acquisition but those that follow
-- the last one within its microsecond, or a counter raised ahead of the
-- clock (RaiseFence) or left there by a clock that stepped back, and only
-- those write the counter again, as old value + 1.
local function next_fence(key)
  local n = clock_us()
  local last = tonumber(redis.call('SET', key, string.format('%.0f', n), 'GET'))
  if last and last >= n then
    n = last + 1
    redis.call('SET', key, string.format('%.0f', n))
  end
  return n
end
