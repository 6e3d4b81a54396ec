"""Moving a collective's data: a share of the op's serial data program on every rank's buffers.

Every move of a collective is element-wise, so the program restricted to a slice of the index
space (aligned vector collectives) or of the columns of rank blocks (block collectives) depends
on nothing outside it: k workers (threads of the local engine, actor processes of the Ray
engine) can each run one share with no synchronisation between them. Programs whose moves are
not index-aligned run whole, in share 0.
"""
from __future__ import annotations

from hcomm.program import BUFFERS
from hcomm.program import execute as execute_moves

from .programs import program_moves
from .types import reducer


def move_share(plan, buffers, redop, part: int = 0, parts: int = 1) -> None:
    """Run share `part` of `parts` of `plan`'s data moves.

    Args:
        buffers: per rank (input, output, scratch) arrays (scratch from Collective.scratch).
        redop: the ReduceOp, or None for data movement only.
    """
    coll = plan.collective
    if not coll.carries_data:
        return
    p = len(buffers)
    reduce_fn = reducer(redop) if redop is not None else None
    block = coll.block
    for (a, b), program in plan.loop_programs():
        moves, aligned = program_moves(program)
        n = b - a
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
                continue
            if block:
                execute_moves(moves, [[None if v is None else v[:, lo:hi] for v in vw] for vw in views], reduce_fn)
            else:
                execute_moves(moves, views, reduce_fn, lo, hi)
