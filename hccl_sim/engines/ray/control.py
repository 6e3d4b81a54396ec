"""The Ray engine's control plane: the allgather of small payloads that every rendezvous is.

- ShmControl: ranks on one host meet in hcomm.shm_control's shared segment (sequence slots and
  futex waits, no process in between): a small op costs about one barrier.
- TransportControl: ranks on several hosts exchange their payloads in ceil(log2 p) rounds of a
  dissemination allgather, over the same peer-to-peer transport that carries their data (no hub).
Both take a deadline on every wait and fail with the HcclError the waiting rank should see.
"""
from __future__ import annotations

import pickle

import numpy as np

from topologies.errors import HcclError


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
    """A dissemination allgather (Bruck's): in round k every rank sends what it knows to rank
    r + 2^k and hears from r - 2^k, so after ceil(log2 p) rounds every rank knows every payload.
    ceil(log2 p) frames on the critical path instead of a gather at rank 0 and a broadcast back
    (2(p-1) frames through one rank); tags of their own per round."""
    max_payload = 1 << 30

    def __init__(self, transport, rank: int, size: int):
        self.transport, self.rank, self.size = transport, rank, size

    def allgather(self, seq: int, payload: bytes, deadline, op=None) -> list:
        tr, rank, p = self.transport, self.rank, self.size
        if p == 1:
            return [payload]
        known = {rank: payload}
        handles, blobs = [], []          # a posted view must outlive its delivery
        step, round_ = 1, 0
        while step < p:
            tag = ("ctl", seq, round_)
            blob = np.frombuffer(pickle.dumps(known, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
            blobs.append(blob)
            handles.append(((rank + step) % p, tr.post_view(rank, (rank + step) % p, tag, blob)))
            msg = tr.take((rank - step) % p, rank, tag, deadline, op)
            known.update(pickle.loads(bytes(np.asarray(msg.data, dtype=np.uint8))))
            msg.consumed()
            step, round_ = step * 2, round_ + 1
        for dst, h in handles:
            try:
                tr.wait_consumed(h, deadline, op)
            except HcclError:
                # every payload is here: a receiver lost since (a rank the fault plan crashes right
                # after this rendezvous, its last acknowledgements unsent) changes nothing we know;
                # `dst` in this control plane's numbering (a handle names the job transport's rank)
                if tr.lost(dst) is None:
                    raise
        return [known[j] for j in range(p)]

    def abort(self, code: str, reason: str) -> None:
        self.transport.abort(code, reason)

    def leave(self) -> None:
        pass                    # closing the transport tells the peers (its goodbye)

    def close(self) -> None:
        pass                    # the transport is closed by its owner
