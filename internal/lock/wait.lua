-- Flag a lock as waited for, so that its release is announced.
-- KEYS[1] the lock's waiting flag; ARGV[1] how long the flag lasts, in ms.
return redis.call('SET', KEYS[1], 1, 'PX', ARGV[1])
