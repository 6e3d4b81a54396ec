"""The per-rank executor: one rank runs its own schedule on real buffers over a transport.

For ranks that share no memory: each rank posts its own slices to the peers its schedule names.
Per step (hcomm.exec.schedules gives a rank's steps):
1. post every Send (a view of this rank's registered memory);
2. wait until the sends of earlier steps that this step may overwrite have been consumed (the
   step's fence);
3. run the step's local copies (copies run at the start of their step on every executor:
   hcomm.program.data_moves);
4. take every Recv in order, copying or reducing straight from the sender's memory, and
   acknowledge it.
At the end, wait until every send has been consumed: only then may the op's buffers change.

An op's steps are derived once for all its ranks, by the first to ask (`schedules.rank_schedules`).

`run_rank_in(memory, ...)` runs it with the rank's buffers in shared memory (staged there unless
they lie there already), so that the peers on the same host read its slices in place: by step words
where the transport has them (hcomm.exec.hosted), else by a message carrying the slice's place
(hcomm.transports.socket, share_host).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from .data_program import COLLECTIVE_TAG, DataProgram, with_scratch
from .hosted import run_hosted
from .schedules import from_steps, rank_schedules

_EMPTY = np.empty(0, dtype=np.uint8)


def _schedules_of(p: int):
    return lambda body: rank_schedules(body.program, p) if body.program else [()] * p


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
        schedule = body.derived(("rank_schedules", data.size), _schedules_of(data.size))[rank]
        if left is not None:
            schedule, left = schedule[:left], left - len(schedule)
        if data.carries_data:
            for name, view in data.named_views(buffers.input, buffers.output, buffers.scratch, a, b).items():
                transport.register(rank, name, view)
        _run_steps(schedule, rank, transport, COLLECTIVE_TAG, reduce_fn, deadline, data.name)


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
    """Execute one schedule (a rank's step list of hcomm.steps ops) for `rank`; its buffers are
    registered on the transport beforehand."""
    _run_steps(from_steps(schedule), rank, transport, tag, reduce_fn, deadline, op)


class _OwnBuffers(dict):
    """A rank's registered buffers by name, each looked up on the transport once per schedule."""

    def __init__(self, transport, rank: int):
        super().__init__()
        self.transport, self.rank = transport, rank

    def __missing__(self, name):
        got = self[name] = self.transport.region(self.rank, name)
        return got


def _run_steps(steps, rank: int, transport, tag, reduce_fn, deadline, op) -> None:
    """Execute `rank`'s steps (hcomm.exec.schedules' form; see the module docstring)."""
    own = _OwnBuffers(transport, rank)
    post, take, wait_consumed = transport.post, transport.take, transport.wait_consumed
    unconsumed = deque()                    # (step, handle) of the sends not yet seen consumed
    for k, (sends, copies, recvs, fence) in enumerate(steps):
        for peer, buf, start, stop in sends:
            unconsumed.append((k, post(rank, peer, tag, buf, start, stop)))
        while unconsumed and unconsumed[0][0] < fence:
            wait_consumed(unconsumed.popleft()[1], deadline, op)
        for sbuf, slo, shi, dbuf, dlo, dhi, operand, olo, ohi in copies:
            if operand is None:
                np.copyto(own[dbuf][dlo:dhi], own[sbuf][slo:shi])
            else:                               # a local reduce: dst = src (op) the operand
                reduce_fn(own[sbuf][slo:shi], own[operand][olo:ohi], own[dbuf][dlo:dhi])
        for peer, dbuf, dlo, dhi, operand, olo, ohi in recvs:
            msg = take(peer, rank, tag, deadline, op)
            if operand is None:
                np.copyto(own[dbuf][dlo:dhi], msg.data)
            else:
                reduce_fn(msg.data, own[operand][olo:ohi], own[dbuf][dlo:dhi])
            msg.consumed()
    for _, handle in unconsumed:
        wait_consumed(handle, deadline, op)
