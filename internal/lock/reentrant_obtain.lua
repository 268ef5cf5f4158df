-- Take a reentrant lock, or take it again (next_fence is fence.lua's,
-- prepended).
-- KEYS[1] the lock, a hash: owner, hold (the hold's id), depth, fence, and
-- one field 'acq:<id>' per acquisition not yet released; KEYS[2] its waiting
-- flag; KEYS[3] (optional) the key's fencing counter, all in one hash slot.
-- ARGV[1] the owner, ARGV[2] the lease length in ms, ARGV[3] '1' when the
-- caller waits for the lock and releases are announced, ARGV[4] the
-- acquisition's random id, which becomes the hold's id if it starts a hold.
-- Returns {hold id, fencing token}: the same for every acquisition of one
-- hold (token 0 without a counter); or {'', -1} when another owner holds the
-- lock: then, with ARGV[3] = '1', the lock is flagged as waited for.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'depth', 1)
  redis.call('HSET', KEYS[1], 'acq:' .. ARGV[4], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local h = redis.call('HMGET', KEYS[1], 'hold', 'fence')
  return {h[1], tonumber(h[2])}
end
if owner then
  if ARGV[3] == '1' then
    redis.call('SET', KEYS[2], 1, 'PX', ARGV[2])
  end
  return {'', -1}
end
local fence = 0
if KEYS[3] then
  fence = next_fence(KEYS[3])
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'hold', ARGV[4], 'depth', 1,
  'fence', string.format('%.0f', fence), 'acq:' .. ARGV[4], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {ARGV[4], fence}
