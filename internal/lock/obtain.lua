-- Take a lock in one Redis and hand out its fencing token (drawn by
-- next_fence, fence.lua, prepended).
-- KEYS[1] the lock, KEYS[2] its fencing counter (same hash slot), KEYS[3]
-- (optional) its waiting flag; ARGV[1] the holder's random token, ARGV[2]
-- the lease length in ms.
-- Returns the fencing token, or -1 when the lock is held by someone else:
-- then, with KEYS[3], the lock is flagged as waited for, so that its
-- release is announced.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if KEYS[3] then
    redis.call('SET', KEYS[3], 1, 'PX', ARGV[2])
  end
  return -1
end
return next_fence(KEYS[2])
