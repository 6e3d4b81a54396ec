"""The Ray engine's control plane: the allgather of small payloads that every rendezvous is.

- ShmControl: ranks on one host meet in hcomm.shm_control's shared segment (sequence slots and
  futex waits, no process in between): a small op costs about one barrier.
- TransportControl (engines/peer_group.py, shared with the MPI engine's sub-communicators): ranks
  on several hosts exchange their payloads in ceil(log2 p) rounds of a dissemination allgather,
  over the same peer-to-peer transport that carries their data (no hub).
Both take a deadline on every wait and fail with the HcclError the waiting rank should see.
"""
from __future__ import annotations

from ..peer_group import TransportControl  # noqa: F401 - the cross-host control plane, engine-neutral


class ShmControl:
    def __init__(self, block):
        self.block = block
        self.max_payload = block.slot_bytes

    def allgather(self, seq: int, payload: bytes, deadline, op=None) -> list:
        return self.block.allgather(seq, payload, deadline, op)

    def abort(self, code: str, reason: str) -> None:
        self.block.abort(code, reason)

    def leave(self) -> None:
        """This rank's run returned: peers still waiting for it learn so at once."""
        self.block.leave()

    def close(self) -> None:
        self.block.close()
