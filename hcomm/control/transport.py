"""The control plane of ranks that share no memory and no hub: an allgather over their peer transport.

Used across hosts (Ray on several nodes, a torchrun job on several hosts) and by every
sub-communicator of an engine whose ranks are processes (over its scoped view of the transport).
"""
from __future__ import annotations

import pickle

import numpy as np

from topologies.errors import Cause, HcclError


class TransportControl:
    """A dissemination allgather (Bruck's) over a peer transport: in round k every rank sends
    what it knows to rank r + 2^k and hears from r - 2^k, so after ceil(log2 p) rounds every rank
    knows every payload. ceil(log2 p) frames on the critical path instead of a gather at rank 0
    and a broadcast back (2(p-1) frames through one rank); tags of their own per round."""
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
            except HcclError as exc:
                # every payload is here: a receiver lost since (a rank the fault plan crashes right
                # after this rendezvous, its last acknowledgements unsent) or an abort that came
                # after the last payload (a peer that finished this round, then aborted) changes
                # nothing we know; the next wait meets the abort. `dst` is in this control plane's
                # numbering (a handle names the job transport's rank)
                if tr.lost(dst) is None and exc.cause != Cause.ABORTED:
                    raise
        return [known[j] for j in range(p)]

    def abort(self, code: str, reason: str) -> None:
        self.transport.abort(code, reason)

    def leave(self) -> None:
        pass                    # closing the transport tells the peers (its goodbye)

    def close(self) -> None:
        pass                    # the transport is closed by its owner
