"""The per-rank executor for a rank some of whose peers share its host: those peers' slices are read
where they lie and the steps are kept in order by step words, not by a message per slice.

HCCL's ranks in one server read each other's buffers directly and synchronise by notify records and
waits; the socket plane's ranks of one host can do the same, their buffers being in shared memory
(hcomm.memory.segment_provider). A rank's schedule is lowered once per loop body and host
(`lower`): each step's sends split into those to other hosts (messages, as hcomm.exec.per_rank
sends them) and those to this host's peers (nothing sent), and each receive from a peer of this
host carries the sender's slice, found from the transfer it belongs to in the body's global step.

Per op the rank publishes where its buffers lie (HostSteps.begin), then per step:
1. set its POSTED word to the step, ringing the doorbells of the host peers it sends to, and post
   the sends to other hosts;
2. run the step's copies;
3. for each receive, in order: from a peer of this host, wait until the peer's POSTED word has
   reached the step and copy or reduce straight from its slice; from another host, take the
   message as usual;
4. set its TAKEN word to the step, ringing the senders' doorbells, and acknowledge the messages;
5. wait until its messages are consumed and until the TAKEN word of every host peer it exposed a
   slice to has reached the step: only then may the next step write.

A sender whose buffers are not in its segments (HostSteps.begin said so) sends its host peers
messages for the op, and they take them as messages: the choice is the sender's, and its peers read
it from its places record before their first receive from it.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from topologies.errors import HcclError

from ..program import BUFFERS
from ..steps import Copy, Recv, Send, Slice
from ..transports.host_steps import step_value
from .data_program import COLLECTIVE_TAG as _TAG
from .data_program import run_copy


class HostedStep(NamedTuple):
    step: int           # the body's global step
    sends: tuple        # Sends to peers on other hosts
    host_sends: tuple   # Sends to peers on this host
    receivers: tuple    # those peers, each once
    copies: tuple
    recvs: tuple        # (Recv, the sender's Slice when the sender shares this host, else None), in order


def lower(body, rank: int, size: int, host: frozenset) -> tuple:
    """`rank`'s steps of loop body `body` (of `size` ranks) with the peers `host` on its host (see
    the module docstring)."""
    out = []
    for ops, g in zip(body.rank_steps(size)[rank], body.step_indices(rank)):
        st = body.program[g].full()
        sends, host_sends, copies, recvs = [], [], [], []
        for item in ops:
            kind = type(item)
            if kind is Send:
                (host_sends if item.peer in host else sends).append(item)
            elif kind is Copy:
                copies.append(item)
            elif kind is Recv:
                i = item.order
                src = Slice(BUFFERS[st.t_sbuf[i]], int(st.t_slo[i]), int(st.t_shi[i])) if item.peer in host else None
                recvs.append((item, src))
        receivers = tuple(dict.fromkeys(s.peer for s in host_sends))
        out.append(HostedStep(g, tuple(sends), tuple(host_sends), receivers, tuple(copies), tuple(recvs)))
    return tuple(out)


def run_hosted(data, rank: int, buffers, transport, host, seq: int, steps: int | None = None) -> None:
    """Execute `rank`'s schedule of every loop of `data` (its buffers `buffers`, scratch included)
    over `transport`, with its host's peers on step words (`host`: the transport's HostSteps);
    `seq` is the op's collective number; with `steps`, only the first `steps` steps, counted over
    the loops (a fault plan's crash mid-op, as hcomm.exec.per_rank.run_rank)."""
    deadline = transport.deadline()
    reduce_fn = data.reduce_fn()
    arrays = (buffers.input, buffers.output, buffers.scratch)
    stamp = seq + 1
    placed = host.begin(stamp, arrays)
    peers = _Peers(data, host, transport, stamp, deadline)
    region = transport.region
    offset, left, op = 0, steps, data.name
    for a, b, body in data.loops:
        if left is not None and left <= 0:
            return
        lowered = body.derived(("hosted", rank, data.size, host.ranks),
                               lambda bd: lower(bd, rank, data.size, host.ranks))
        if left is not None:
            lowered, left = lowered[:left], left - len(lowered)
        for name, view in data.named_views(*arrays, a, b).items():
            transport.register(rank, name, view)
        peers.loop(a, b)
        for st in lowered:
            value = step_value(stamp, offset + st.step)
            posted = []
            if st.host_sends:
                if placed:
                    host.post(value, st.receivers)
                else:
                    posted = [transport.post(rank, s.peer, _TAG, s.src.buf, s.src.start, s.src.stop)
                              for s in st.host_sends]
            for s in st.sends:
                posted.append(transport.post(rank, s.peer, _TAG, s.src.buf, s.src.start, s.src.stop))
            for c in st.copies:
                run_copy(region, rank, c, reduce_fn)
            direct, taken = [], []
            for item, src in st.recvs:
                views = None if src is None else peers.views(item.peer)
                if views is None:
                    msg = transport.take(item.peer, rank, _TAG, deadline, op)
                    got = msg.data
                    taken.append(msg)
                else:
                    q = item.peer
                    if host.posted(q) < value:
                        transport.wait_for(q, lambda: host.posted(q) >= value, deadline, op, tag=_TAG)
                    got = views[src.buf][src.start:src.stop]
                    direct.append(q)
                d = item.dst
                out = region(rank, d.buf)[d.start:d.stop]
                if item.reduce_with is None:
                    np.copyto(out, got)
                else:
                    w = item.reduce_with
                    reduce_fn(got, region(rank, w.buf)[w.start:w.stop], out)
            if direct:
                host.took(value, direct)
            for msg in taken:
                msg.consumed()
            for msg in posted:
                transport.wait_consumed(msg, deadline, op)
            if placed:
                for r in st.receivers:
                    if host.taken(r) < value:
                        transport.wait_for(r, lambda: host.taken(r) >= value, deadline, op, for_acks=True, tag=_TAG)
        offset += len(body.program)


class _Peers:
    """The op's host peers' buffers as this rank reads them: each peer's places, awaited and mapped
    at this rank's first receive from it, and their views for the loop being run."""

    def __init__(self, data, host, transport, stamp, deadline):
        self.data, self.host, self.transport, self.stamp, self.deadline = data, host, transport, stamp, deadline
        self._arrays, self._views = {}, {}
        self._loop = (0, 0)

    def loop(self, a, b) -> None:
        self._loop, self._views = (a, b), {}

    def views(self, peer):
        """`peer`'s named views of this loop, or None when its slices come as messages."""
        got = self._views.get(peer, False)
        if got is not False:
            return got
        arrays = self._arrays.get(peer, False)
        if arrays is False:
            arrays = self._arrays[peer] = self._places(peer)
        got = self._views[peer] = None if arrays is None else self.data.named_views(*arrays, *self._loop)
        return got

    def _places(self, peer):
        host, stamp, op = self.host, self.stamp, self.data.name
        if host.places_stamp(peer) < stamp:
            self.transport.wait_for(peer, lambda: host.places_stamp(peer) >= stamp, self.deadline, op, tag=_TAG)
        now = host.places_stamp(peer)
        if now != stamp:
            raise HcclError("E_INTERNAL", f"{op} (collective #{stamp - 1}): rank {peer} published the places of "
                            f"collective #{now - 1} while this rank still reads its slices", op=op, peers=(peer,))
        return host.peer_arrays(peer)
