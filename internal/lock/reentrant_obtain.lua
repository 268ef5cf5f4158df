-- Take a reentrant lock, or take it again (next_fence is fence.lua's,
-- prepended).
-- KEYS[1] the lock, a hash: owner, depth, fence; KEYS[2] its waiting flag;
-- KEYS[3] (optional) the key's fencing counter, all in one hash slot.
-- ARGV[1] the owner, ARGV[2] the lease length in ms, ARGV[3] '1' when the
-- caller waits for the lock and releases are announced.
-- Returns the hold's fencing token (0 without one), the same for every
-- acquisition of one hold, or -1 when another owner holds the lock: then,
-- with ARGV[3] = '1', the lock is flagged as waited for.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'depth', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'fence'))
end
if owner then
  if ARGV[3] == '1' then
    redis.call('SET', KEYS[2], 1, 'PX', ARGV[2])
  end
  return -1
end
local fence = 0
if KEYS[3] then
  fence = next_fence(KEYS[3])
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'depth', 1, 'fence', string.format('%.0f', fence))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
