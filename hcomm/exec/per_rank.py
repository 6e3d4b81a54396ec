"""The per-rank executor: one rank runs its own schedule on real buffers over a transport.

For ranks that share no memory: each rank posts its own slices to the peers its schedule names.
Per step:
1. post every Send (a view of this rank's registered memory);
2. run the step's local copies (copies run at the start of their step on every executor:
   hcomm.program.data_moves);
3. take every Recv in order, copying or reducing straight from the sender's memory, and
   acknowledge it;
4. wait until this rank's own sends have been consumed: only then may the next step write.

`run_rank_in(memory, ...)` runs it with the rank's buffers in shared memory (staged there unless
they lie there already), so that the peers on the same host read its slices in place: by step words
where the transport has them (hcomm.exec.hosted), else by a message carrying the slice's place
(hcomm.transports.socket, share_host).
"""
from __future__ import annotations

import numpy as np

from ..steps import Copy, Recv, Send
from .data_program import COLLECTIVE_TAG, DataProgram, run_copy, with_scratch
from .hosted import run_hosted

_EMPTY = np.empty(0, dtype=np.uint8)


def run_rank(data: DataProgram, rank: int, buffers, transport, steps: int | None = None) -> None:
    """Execute `rank`'s schedule of every loop of `data` over `transport` (its buffers registered
    loop by loop); with `steps`, only its first `steps` steps, counted over the loops: what a rank
    that dies as the next one starts has sent (a fault plan's crash mid-op)."""
    deadline = transport.deadline()
    reduce_fn = data.reduce_fn()
    left = steps
    if not data.carries_data:
        transport.register(rank, "input", _EMPTY)
        reduce_fn = None
    else:
        buffers = with_scratch(data, buffers)
    for a, b, body in data.loops:
        if left is not None and left <= 0:
            return
        schedule = body.rank_steps(data.size)[rank]
        if left is not None:
            schedule, left = schedule[:left], left - len(schedule)
        if data.carries_data:
            for name, view in data.named_views(buffers.input, buffers.output, buffers.scratch, a, b).items():
                transport.register(rank, name, view)
        run_schedule(schedule, rank, transport, COLLECTIVE_TAG, reduce_fn, deadline, data.name)


def run_rank_in(memory, data: DataProgram, rank: int, buffers, transport, seq: int | None = None,
                steps: int | None = None) -> None:
    """run_rank with the input, output and scratch in `memory`'s segments (a SegmentProvider):
    a host input is copied into the rank's input staging segment, a host output is written in its
    output one and copied out at the end, an in-place op's one buffer staged once. Where the
    transport reaches this rank's host peers by step words (`host_steps`) and the op's collective
    number `seq` is given, the schedule runs on them (hcomm.exec.hosted): every rank of the host
    then takes that path for every op that carries data, whatever its buffers."""
    host = transport.host_steps if seq is not None else None
    x, out = buffers.input, buffers.output
    if not data.carries_data or (host is None and (x is None or out is None)):
        run_rank(data, rank, buffers, transport, steps)
        return
    sx = x
    if x is not None and x.nbytes and memory.where(x) is None:
        _, sx = memory.owned.array("input", x.shape, x.dtype)
        np.copyto(sx, x)
    so, back = out, None
    if out is not None and out.nbytes and memory.where(out) is None:
        if out is x:
            so, back = sx, sx
        else:                                  # (an output overlapping the input: the input was copied first)
            _, so = memory.owned.array("output", out.shape, out.dtype)
            back = so
    scratch = buffers.scratch
    like = x if x is not None else out
    if scratch is None and data.scratch_shape is not None and like is not None:
        _, scratch = memory.owned.array("scratch", data.scratch_shape, like.dtype)
    staged = buffers._replace(input=sx, output=so, scratch=scratch)
    if host is not None:
        run_hosted(data, rank, staged, transport, host, seq, steps)
    else:
        run_rank(data, rank, staged, transport, steps)
    if back is not None and steps is None:
        np.copyto(out, back)


def run_schedule(schedule, rank: int, transport, tag, reduce_fn, deadline=None, op: str | None = None) -> None:
    """Execute one schedule (a rank's step list) for `rank`; its buffers are registered on the
    transport beforehand."""
    region = transport.region
    for step in schedule:
        posted = []
        for item in step:
            if type(item) is Send:
                s = item.src
                posted.append(transport.post(rank, item.peer, tag, s.buf, s.start, s.stop))
        for item in step:
            if type(item) is Copy:
                run_copy(region, rank, item, reduce_fn)
        for item in step:
            if type(item) is Recv:
                msg = transport.take(item.peer, rank, tag, deadline, op)
                d = item.dst
                out = region(rank, d.buf)[d.start:d.stop]
                if item.reduce_with is None:
                    np.copyto(out, msg.data)
                else:
                    w = item.reduce_with
                    reduce_fn(msg.data, region(rank, w.buf)[w.start:w.stop], out)
                msg.consumed()
        for msg in posted:
            transport.wait_consumed(msg, deadline, op)
