"""Moving a collective's data: a share of the op's serial data program on every rank's buffers.

Every move of a collective is element-wise, so the program restricted to a slice of the index
space (aligned vector collectives) or of the columns of rank blocks (block collectives) depends
on nothing outside it: k workers (threads of the local engine, actor processes of the Ray
engine) can each run one share with no synchronisation between them. Programs whose moves are
not index-aligned run whole, in share 0.
"""
from __future__ import annotations

from hcomm.program import BUFFERS, rank_step_indices
from hcomm.program import execute as execute_moves

from .programs import program_moves
from .types import reducer


def move_share(plan, buffers, redop, part: int = 0, parts: int = 1, until=None) -> None:
    """Run share `part` of `parts` of `plan`'s data moves.

    Args:
        buffers: per rank (input, output, scratch) arrays (scratch from Collective.scratch).
        redop: the ReduceOp, or None for data movement only.
        until: (rank, steps): only the moves of the global steps before `rank`'s step number
            `steps` (counted over the op's loops), i.e. what a rank that dies as that step starts
            has done of its share (a fault plan's rank_crash mid-op, on the Ray engine).
    """
    coll = plan.collective
    if not coll.carries_data:
        return
    reduce_fn = reducer(redop) if redop is not None else None
    left = None if until is None else until[1]
    for (a, b), program in plan.loop_programs():
        stop = None
        if left is not None:
            starts = rank_step_indices(program, until[0])
            if left < len(starts):
                stop = starts[left]
            left -= len(starts)
        moves, aligned = program_moves(program)
        if stop is not None:        # split as the whole program is, so shares stay disjoint
            moves = program_moves(program, stop)[0]
        _run_loop(coll, moves, aligned, a, b, buffers, reduce_fn, part, parts)
        if stop is not None:
            return


def _run_loop(coll, moves, aligned, a, b, buffers, reduce_fn, part, parts) -> None:
    """One loop's moves (over elements [a, b) of the op), share `part` of `parts`."""
    p = len(buffers)
    n = b - a
    block = coll.block
    named = [coll.views(p, x, out, scratch, a, b) for x, out, scratch in buffers]
    views = [[v.get(name) for name in BUFFERS] for v in named]
    if parts == 1:
        execute_moves(moves, views, reduce_fn)
    elif not (block or aligned):
        if part == 0:
            execute_moves(moves, views, reduce_fn)
    else:
        lo, hi = n * part // parts, n * (part + 1) // parts
        if lo == hi:
            return
        if block:
            execute_moves(moves, [[None if v is None else v[:, lo:hi] for v in vw] for vw in views], reduce_fn)
        else:
            execute_moves(moves, views, reduce_fn, lo, hi)
