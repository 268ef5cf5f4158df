-- Take a lock in one Redis and hand out its fencing token (drawn by
-- next_fence, fence.lua, prepended).
-- KEYS[1] the lock, KEYS[2] its waiting flag, KEYS[3] (optional) its fencing
-- counter, all in one hash slot; ARGV[1] the holder's random token, ARGV[2]
-- the lease length in ms, ARGV[3] '1' when the caller waits for the lock and
-- releases are announced.
-- Returns the fencing token (0 without a counter), or -1 when the lock is
-- held by someone else: then, with ARGV[3] = '1', the lock is flagged as
-- waited for, so that its release is announced.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then
    redis.call('SET', KEYS[2], 1, 'PX', ARGV[2])
  end
  return -1
end
if KEYS[3] then
  return next_fence(KEYS[3])
end
return 0
