"""Transports: how one rank's slice reaches another rank, one module each, one protocol (`base`).

- `inprocess`: ranks are threads of one process; the receiver reads the sender's memory in place.
- `socket`: ranks are processes anywhere; direct TCP connections between every pair that talks.
- `ray_object`: ranks are Ray actors; payloads travel through Ray's object store between nodes.

The socket and Ray transports are imported from their modules (`hcomm.transports.socket`,
`hcomm.transports.ray_object`) so that importing hcomm never imports Ray.
"""
from .base import Message, Transport
from .inprocess import STALL_S, InProcessTransport, Watch

__all__ = ["Message", "Transport", "InProcessTransport", "Watch", "STALL_S"]
