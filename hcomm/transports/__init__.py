"""Transports: how one rank's slice reaches another rank, one module each, one protocol (`base`).

- `inprocess`: ranks are threads of one process; the receiver reads the sender's memory in place.
- `socket`: ranks are processes anywhere; direct TCP connections between every pair that talks.
- `ray_object`: ranks are Ray actors; payloads travel through Ray's object store between nodes.
- `peer`: the half every transport between processes shares (PeerEndpoint).

The default plane between ranks that share no memory (across Ray nodes, MPI-less processes) is
`socket`: on this machine, for an 8-rank 64 MiB fp32 ring AllReduce run by the per-rank executor,
it moved 0.18-0.24 GB/s busbw (spawned processes) and 0.13-0.21 GB/s (Ray actors on two Ray
nodes), against 0.08 GB/s through Ray's object store, where every step pays a ray.put, two actor
calls and a pull between object stores (experiments/transports_bench.py). `ray_object` stays for
clusters where ranks cannot open TCP connections to each other.

The socket and Ray transports are imported from their modules (`hcomm.transports.socket`,
`hcomm.transports.ray_object`) so that importing hcomm never imports Ray.
"""
from .base import Message, Transport
from .inprocess import STALL_S, InProcessTransport, Watch

__all__ = ["Message", "Transport", "InProcessTransport", "Watch", "STALL_S"]
