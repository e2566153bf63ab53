"""Live-output relays (:mod:`runtime.relay`): Redis Streams, and the actor that publishes
an embedded host's turns to one.

Imports nothing heavy: the Redis client (coredis) loads only when a relay is opened.
"""

from actors.relays.publisher import RelayPublisher, attach_relay
from actors.relays.redis_streams import RedisRelay, RedisRelayWriter, StepRestarted

__all__ = ["RedisRelay", "RedisRelayWriter", "RelayPublisher", "StepRestarted", "attach_relay"]
