-- Write a loaded entry unless it was invalidated while it was being loaded.
-- KEYS[1] the entry, KEYS[2] its generation (same hash slot)
-- ARGV[1] the generation begin.lua returned, ARGV[2] the entry,
-- ARGV[3] its TTL in ms, ARGV[4] 'NX' to write only where nothing is
-- (placeholders: they must never replace a real value)
-- Returns 1 when written, 0 when not.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
if ARGV[4] == 'NX' then
  if redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3], 'NX') then
    return 1
  end
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
