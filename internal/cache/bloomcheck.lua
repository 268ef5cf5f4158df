-- Ask a shard of the Bloom filter whether an id may be in the set.
-- KEYS[1] a shard's bitmap, KEYS[2] its parameters "m:k", KEYS[3] the
-- catalog epoch its bitmap was built from (same hash slot)
-- ARGV[1] the parameters the caller computed positions for,
-- ARGV[2..] the id's bit positions
-- Returns 1 (may be present), {0, epoch} (certainly absent from the
-- catalog of that epoch; '' when the builder recorded none), -1 (there is
-- no filter) or, when the filter has other parameters, those parameters,
-- so the caller can compute the positions again.
-- A bitmap gone without its parameters (evicted, say) is no filter either:
-- GETBIT on a missing key reads 0, which would turn away every id.
local params = redis.call('GET', KEYS[2])
if not params or redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
if params ~= ARGV[1] then
  return params
end
for i = 2, #ARGV do
  if redis.call('GETBIT', KEYS[1], ARGV[i]) == 0 then
    return {0, redis.call('GET', KEYS[3]) or ''}
  end
end
return 1
