"""The control plane of ranks that share no memory and no hub: an allgather over their peer transport.

Used across hosts (Ray on several nodes, a torchrun job on several hosts), between the leaders of
hosts whose ranks meet in shared memory (hcomm.control.nodes), and by every sub-communicator of
an engine whose ranks are processes (over its scoped view of the transport).
"""
from __future__ import annotations

import pickle

import numpy as np

from topologies.errors import Cause, HcclError

from .base import ControlPlane


class TransportControl(ControlPlane):
    """A dissemination allgather (Bruck's) over a peer transport: in round k every rank sends
    what it knows to rank r + 2^k and hears from r - 2^k, so after ceil(log2 p) rounds every rank
    knows every payload. ceil(log2 p) frames on the critical path instead of a gather at rank 0
    and a broadcast back (2(p-1) frames through one rank); tags of their own per round.

    `members` (default 0..size-1) are the transport's ranks of this plane's 0..size-1: a plane
    over some of the job's ranks (the hosts' leaders) on the job's transport, with the job's
    tags, so that the job's aborts meet it."""
    max_payload = 1 << 30

    def __init__(self, transport, rank: int, size: int, members=None):
        self.transport, self.rank, self.size = transport, rank, size
        self.members = tuple(range(size)) if members is None else tuple(members)

    def allgather(self, seq: int, payload: bytes, deadline, op=None) -> list:
        payloads, sends = self.exchange(seq, payload, deadline, op)
        self.settle(sends, deadline, op)
        return payloads

    def exchange(self, seq: int, payload: bytes, deadline, op=None):
        """(every rank's payload, this rank's sends): the allgather but for the wait until the
        peers took what this rank sent (`settle`), which a caller may do later."""
        tr, rank, p, ranks = self.transport, self.rank, self.size, self.members
        if p == 1:
            return [payload], []
        known = {rank: payload}
        sends = []                       # a posted view must outlive its delivery
        step, round_ = 1, 0
        me = ranks[rank]
        while step < p:
            tag = ("ctl", seq, round_)
            blob = np.frombuffer(pickle.dumps(known, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
            dst = (rank + step) % p
            sends.append((dst, blob, tr.post_view(me, ranks[dst], tag, blob)))
            msg = tr.take(ranks[(rank - step) % p], me, tag, deadline, op)
            known.update(pickle.loads(bytes(np.asarray(msg.data, dtype=np.uint8))))
            msg.consumed()
            step, round_ = step * 2, round_ + 1
        return [known[j] for j in range(p)], sends

    def settle(self, sends, deadline, op=None) -> None:
        tr = self.transport
        for dst, _, h in sends:
            try:
                tr.wait_consumed(h, deadline, op)
            except HcclError as exc:
                # every payload is here: a receiver lost since (a rank the fault plan crashes right
                # after this rendezvous, its last acknowledgements unsent) or an abort that came
                # after the last payload (a peer that finished this round, then aborted) changes
                # nothing we know; the next wait meets the abort
                if tr.lost(self.members[dst]) is None and exc.cause != Cause.ABORTED:
                    raise

    def abort(self, code: str, reason: str) -> None:
        self.transport.abort(code, reason)
