"""The two executors of the engine contract (engines/base.py), shared by every engine.

- `central_share`: a share of the op's serial data program over every rank's buffers
  (hccl_sim.dataplane), for participants that can address all ranks' memory;
- `per_rank`: this rank's own schedule over an hcomm Transport (hcomm.executor), for ranks that
  share no memory: each rank posts its own slices to the peers its schedule names.
"""
from __future__ import annotations

import numpy as np

from hcomm.executor import execute as execute_schedule
from hcomm.program import BUFFERS, execute as execute_moves

from ..dataplane import move_share
from ..planner import program_moves_for, program_rank_steps
from ..types import reducer

COLLECTIVE_TAG = "coll"
_EMPTY = np.empty(0, dtype=np.uint8)


def with_scratch(plan, buffers, p: int):
    """RankBuffers with the scratch area the op's schedule uses (allocated when not given)."""
    if buffers.scratch is not None or buffers.input is None or not plan.collective.has_scratch:
        return buffers
    return buffers._replace(scratch=plan.collective.scratch(p, plan.loops, buffers.input.dtype))


def central_share(plan, buffers: list, redop, part: int = 0, parts: int = 1) -> None:
    """Share `part` of `parts` of the op's data moves, on every rank's RankBuffers (rank order,
    scratch allocated: see with_scratch)."""
    move_share(plan, [tuple(b) for b in buffers], redop, part, parts)


def own_result(plan, inputs, out, redop, rank: int) -> None:
    """`rank`'s output into `out`, computed from every rank's input (`inputs`, stacked on a first
    axis of p) by the moves that decide it: for a rank holding every rank's input (the eager
    protocol). Exact: the same moves, in the same order, as the whole program."""
    coll = plan.collective
    p = inputs.shape[0]
    reduce_fn = reducer(redop) if redop is not None else None
    if not coll.block:                     # vector layouts: every view is a slice of one row
        xs = inputs.reshape(p, -1)
        outs = np.empty((p, out.size), dtype=out.dtype)
        for (a, b), program in plan.loop_programs():
            views = [(xs[j, a:b], outs[j, a:b], None) for j in range(p)]
            execute_moves(program_moves_for(program, rank), views, reduce_fn)
        out.reshape(-1)[:] = outs[rank]
        return
    outs = [out if j == rank else np.empty(out.shape, dtype=out.dtype) for j in range(p)]
    scratch = [coll.scratch(p, plan.loops, out.dtype) for _ in range(p)] if coll.has_scratch else [None] * p
    for (a, b), program in plan.loop_programs():
        named = [coll.views(p, inputs[j], outs[j], scratch[j], a, b) for j in range(p)]
        execute_moves(program_moves_for(program, rank), [[v.get(n) for n in BUFFERS] for v in named], reduce_fn)


def per_rank(rank: int, plan, buffers, redop, transport, size: int) -> None:
    """Execute `rank`'s schedule of every loop over `transport` (buffers registered per loop)."""
    reduce_fn = reducer(redop) if redop is not None else None
    deadline = transport.deadline()
    coll = plan.collective
    if not coll.carries_data:
        transport.register(rank, "input", _EMPTY)
        for _, program in plan.loop_programs():
            execute_schedule(program_rank_steps(program, size)[rank], rank, transport, COLLECTIVE_TAG, None,
                             deadline, coll.method)
        return
    buffers = with_scratch(plan, buffers, size)
    for (a, b), program in plan.loop_programs():
        for name, view in coll.views(size, buffers.input, buffers.output, buffers.scratch, a, b).items():
            transport.register(rank, name, view)
        execute_schedule(program_rank_steps(program, size)[rank], rank, transport, COLLECTIVE_TAG, reduce_fn,
                         deadline, coll.method)
