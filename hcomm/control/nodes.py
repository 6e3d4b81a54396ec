"""The control plane of ranks on several hosts whose ranks on one host share memory: each host's
ranks meet in a control block of their own (hcomm.control.shm), and only one rank per host, its
leader, crosses hosts.

An allgather of a host with k ranks is
1. a round in the host's block: every local rank publishes its payload, so each knows its host's;
2. the leaders' allgather of their hosts' payloads over the job's peer transport
   (TransportControl over the leaders alone, with the job's tags, so that the job's aborts meet it);
3. a second round in the block: the leader publishes the other hosts' payloads, the others nothing.

So a rendezvous of p ranks on n hosts puts ceil(log2 n) network frames on its critical path
instead of ceil(log2 p), and every rank but the n leaders waits on the block's futex instead of a
socket reader thread: what lets small ops across hosts keep up with gloo's. The leader's wait for
its frames' acknowledgements comes after it has published (step 3), off the critical path.

Failure: an error a leader meets crossing hosts (a peer's abort notice, a peer that returned or
died) is published in its block before it is raised, so the host's other ranks raise it too
instead of waiting out the deadline; a block's abort (a local rank that failed) reaches the other
hosts when its leader's transport closes.
"""
from __future__ import annotations

import struct

from topologies.errors import HcclError

from .base import ControlPlane
from .transport import TransportControl

_LEN = struct.Struct("<I")
PAYLOAD_BYTES = 68 << 10             # a rank's payload at most: an eager op's input and its call
BUDGET_BYTES = 8 << 20               # at most this in a leader's slot of the other hosts' payloads
_BLOB_SPARE = 64                     # a pickled dict's framing, per host


class HostLayout:
    """Where a job's ranks are: `hosts`, the ranks of each host (ascending), hosts ordered by their
    first rank; for every rank its host and its index there."""

    def __init__(self, host_of):
        order = {}
        for r, h in enumerate(host_of):
            order.setdefault(h, []).append(r)
        self.hosts = [tuple(rs) for rs in order.values()]
        self.size = len(host_of)
        self.host_index = [0] * self.size
        self.local_index = [0] * self.size
        for k, rs in enumerate(self.hosts):
            for i, r in enumerate(rs):
                self.host_index[r], self.local_index[r] = k, i
        self.leaders = tuple(rs[0] for rs in self.hosts)

    def payload_bytes(self) -> int:
        """The largest payload a rank may publish: the same on every rank (it decides which ops are
        eager), so that a leader's slot of the other hosts' payloads stays within BUDGET_BYTES,
        but never under 4 KiB (a call's signature and clock must fit): past some 2000 ranks the
        slot grows instead (its pages are touched only as far as it is written)."""
        others = self.size - min(len(rs) for rs in self.hosts)
        return PAYLOAD_BYTES if not others else max(4096, min(PAYLOAD_BYTES, BUDGET_BYTES // others - _LEN.size))

    def slot_bytes(self) -> int:
        """A block slot: a rank's payload, or the other hosts' payloads a leader publishes."""
        n = self.payload_bytes()
        others = self.size - min(len(rs) for rs in self.hosts)
        return max(n, others * (n + _LEN.size) + len(self.hosts) * _BLOB_SPARE)


def _bundle(payloads) -> bytes:
    return b"".join(_LEN.pack(len(x)) + x for x in payloads)


def _unbundle(raw: bytes, count: int) -> list:
    out, at = [], 0
    for _ in range(count):
        n, = _LEN.unpack_from(raw, at)
        at += _LEN.size
        out.append(raw[at:at + n])
        at += n
    return out


class NodeControl(ControlPlane):
    """One rank's control plane: `block`, its handle on its host's control block (attached as its
    index there; None for a host's only rank); `transport`, the job's peer transport; `layout`, a
    HostLayout of the job."""

    def __init__(self, block, transport, rank: int, layout: HostLayout):
        self.block, self.rank, self.layout = block, rank, layout
        self._rounds = 1 if len(layout.hosts) == 1 else 2        # the block's rounds per allgather
        if block is not None:
            block.as_part_of(layout.hosts[layout.host_index[rank]], self._rounds)
        self.max_payload = layout.payload_bytes()
        self.host = layout.host_index[rank]
        self.leader = layout.leaders[self.host] == rank
        self.across = None
        if self.leader and len(layout.hosts) > 1:
            self.across = TransportControl(transport, self.host, len(layout.hosts), members=layout.leaders)

    def allgather(self, seq: int, payload: bytes, deadline, op=None) -> list:
        block, layout = self.block, self.layout
        local = [payload] if block is None else block.allgather(self._rounds * seq, payload, deadline, op)
        if len(layout.hosts) == 1:
            return local
        sends = ()
        if self.across is not None:
            try:
                bundles, sends = self.across.exchange(seq, _bundle(local), deadline, op)
            except HcclError as exc:
                self._tell_host(exc)
                raise
            mine = _bundle(bundles[k] for k in range(len(layout.hosts)) if k != self.host)
        else:
            mine = b""
        others = mine if block is None else block.allgather(2 * seq + 1, mine, deadline, op)[0]
        if sends:
            self.across.settle(sends, deadline, op)
        out = [None] * layout.size
        at = 0
        for k, ranks in enumerate(layout.hosts):
            if k == self.host:
                payloads = local
            else:
                n, = _LEN.unpack_from(others, at)
                payloads = _unbundle(others[at + _LEN.size:at + _LEN.size + n], len(ranks))
                at += _LEN.size + n
            for r, x in zip(ranks, payloads):
                out[r] = x
        return out

    def _tell_host(self, exc: HcclError) -> None:
        """The host's other ranks wait for this leader in the block: they raise its error too."""
        if self.block is None:
            return
        try:
            self.block.abort(exc.code, exc.reason)
        except HcclError:
            pass                # the block is closed: nobody waits there

    def abort(self, code: str, reason: str) -> None:
        """This host's ranks fail at once; the other hosts learn it from the transport: this rank's
        goodbye as it closes, or a communicator's abort notices (which their leaders then publish in
        their blocks)."""
        if self.block is not None:
            self.block.abort(code, reason)

    def abort_for_communicator(self, code: str, reason: str) -> None:
        """The host's block is the world communicator's: its ranks fail at once (the other hosts'
        leaders learn it from the communicator's abort notices)."""
        self.abort(code, reason)

    def leave(self) -> None:
        if self.block is not None:
            self.block.leave()

    def close(self) -> None:
        if self.block is not None:
            self.block.close()
