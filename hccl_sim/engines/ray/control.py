"""The Ray engine's control plane: the allgather of small payloads that every rendezvous is.

- ShmControl: ranks on one host meet in hcomm.shm_control's shared segment (sequence slots and
  futex waits, no process in between): a small op costs about one barrier.
- TransportControl: ranks on several hosts gather their payloads at rank 0 and get the whole
  list back, over the same peer-to-peer transport that carries their data (no hub).
Both take a deadline on every wait and fail with the HcclError the waiting rank should see.
"""
from __future__ import annotations

import pickle

import numpy as np


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


class TransportControl:
    """Gather at rank 0, broadcast back: 2(p-1) messages per rendezvous, on tags of their own."""
    max_payload = 1 << 30

    def __init__(self, transport, rank: int, size: int):
        self.transport, self.rank, self.size = transport, rank, size

    def allgather(self, seq: int, payload: bytes, deadline, op=None) -> list:
        tr, rank, p = self.transport, self.rank, self.size
        if p == 1:
            return [payload]
        up, down = ("ctl", seq), ("ctl-all", seq)
        if rank == 0:
            parts = [payload]
            for src in range(1, p):
                msg = tr.take(src, 0, up, deadline, op)
                parts.append(bytes(np.asarray(msg.data, dtype=np.uint8)))
                msg.consumed()
            blob = np.frombuffer(pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
            handles = [tr.post_view(0, dst, down, blob) for dst in range(1, p)]
            for h in handles:
                tr.wait_consumed(h, deadline, op)
            return parts
        h = tr.post_view(rank, 0, up, np.frombuffer(payload, dtype=np.uint8))
        msg = tr.take(0, rank, down, deadline, op)
        parts = pickle.loads(bytes(np.asarray(msg.data, dtype=np.uint8)))
        msg.consumed()
        tr.wait_consumed(h, deadline, op)
        return parts

    def abort(self, code: str, reason: str) -> None:
        self.transport.abort(code, reason)

    def leave(self) -> None:
        pass                    # closing the transport tells the peers (its goodbye)

    def close(self) -> None:
        pass                    # the transport is closed by its owner
