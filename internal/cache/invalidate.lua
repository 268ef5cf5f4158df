-- Drop an entry and bump its generation, so that a load already under way
-- cannot write back what it read before the change.
-- KEYS[1] the entry, KEYS[2] its generation (same hash slot)
-- ARGV[1] how long the generation lives, in ms
redis.call('DEL', KEYS[1])
redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
