"""The control plane of ranks on one host: a shared-memory ControlBlock (hcomm.control.shm) as
one rank's ControlPlane."""
from __future__ import annotations

from .base import ControlPlane


class ShmControl(ControlPlane):
    """A ControlBlock as a rank's control plane (allgather, abort, leave, close). The block is the
    world communicator's alone: a communicator's abort fails its rounds there too."""

    def __init__(self, block):
        self.block = block
        self.max_payload = block.slot_bytes

    def allgather(self, seq: int, payload: bytes, deadline, op=None) -> list:
        return self.block.allgather(seq, payload, deadline, op)

    def allgather_records(self, seq: int, payload: bytes, layout, deadline, op=None):
        return self.block.allgather_records(seq, payload, layout, deadline, op)

    def abort(self, code: str, reason: str) -> None:
        self.block.abort(code, reason)

    def abort_for_communicator(self, code: str, reason: str) -> None:
        self.block.abort(code, reason)

    def leave(self) -> None:
        """This rank's run returned: peers still waiting for it learn so at once."""
        self.block.leave()

    def close(self) -> None:
        self.block.close()
