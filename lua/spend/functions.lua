-- The library form (Redis 7): one function per operation, named
-- `<library>_<op>` (FCALL qw_<version>_spend ...), each taking the KEYS and
-- ARGV of core.lua's header (ARGV[1] names the operation). The assembler
-- (src/quota/library.rs) starts the text with the library's name, which
-- carries its version, so two versions can be loaded side by side during a
-- rolling deploy, and defines LIBRARY, that name.

redis.register_function(LIBRARY .. '_spend', Ops.spend)
redis.register_function(LIBRARY .. '_settle', Ops.settle)
redis.register_function(LIBRARY .. '_block', Ops.block)
redis.register_function(LIBRARY .. '_peek', Ops.peek)
redis.register_function(LIBRARY .. '_sync', Ops.sync)
redis.register_function(LIBRARY .. '_undrift', Ops.undrift)
redis.register_function(LIBRARY .. '_claim', Ops.claim)
