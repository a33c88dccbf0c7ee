"""The ZMQ tensor transport: tarserve's sender, the receiver, wire format v2 and CURVE keys.

See ``docs/wire.md`` for the message format; ``Receiver`` is the trainer's side.
"""

from .receiver import EpochEnd, Receiver, ReceiveStats
from .sender import Sender, SendStats
from .urls import Endpoint, is_zmq_url, parse_endpoints
from .wire import Batch, MessageError, decode, encode_batch

__all__ = [
    "Batch", "Endpoint", "EpochEnd", "MessageError", "ReceiveStats", "Receiver", "SendStats", "Sender",
    "decode", "encode_batch", "is_zmq_url", "parse_endpoints",
]
