-- Start a load: make sure the entry has a generation and report both.
-- KEYS[1] the entry, KEYS[2] its generation (same hash slot)
-- ARGV[1] how long the generation lives, in ms
-- Returns {entry or nil, generation}. A load passes the generation to
-- fill.lua, which writes only if no invalidation has bumped it since.
redis.call('SET', KEYS[2], '0', 'NX')
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}
