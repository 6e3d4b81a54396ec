"""The central executor: a share of an op's serial data program, run on every rank's buffers.

For participants that can address every rank's memory (threads of one process, processes that
map each other's shared memory). Every move is element-wise, so the program restricted to a slice
of the index space (flat layouts whose moves are index-aligned) or to a slice of the columns of
every row (row layouts) depends on nothing outside it: k workers can each run one share with no
synchronisation between them. Programs whose moves are not index-aligned run whole, in share 0.
"""
from __future__ import annotations

from .. import program as prog
from .data_program import DataProgram

# How much of a share runs at a time (an AllReduce's blocks are moved a piece at a time, so that
# the adds into a block and the copies out of it find the piece in the cache). Measured on a 2-core
# host (1 MiB L2 a core, 32 MiB L3), 8 ranks, 64 MiB AllReduce, median ms: whole shares 69-77,
# 1 MiB pieces 52.7, 2 MiB 41-50, 4 MiB 53.1 (experiments/RESULTS.md, issue 38).
CHUNK_BYTES = 2 << 20


def run_share(data: DataProgram, buffers, part: int = 0, parts: int = 1, until=None) -> None:
    """Run share `part` of `parts` of `data`'s moves.

    Args:
        buffers: every rank's (input, output, scratch) arrays, in rank order, scratch allocated
            (data_program.with_scratch).
        until: (rank, steps): only the moves of the global steps before `rank`'s step number
            `steps`, counted over the op's loops: what a rank that dies as that step starts has
            done of its share (a fault plan's crash mid-op).
    """
    if not data.carries_data:
        return
    reduce_fn = data.reduce_fn()
    left = None if until is None else until[1]
    for a, b, body in data.loops:
        moves, stop = body.moves, None
        if left is not None:
            starts = body.step_indices(until[0])
            if left < len(starts):
                stop = starts[left]
                moves = body.moves_before(stop)      # split as the whole program is: shares stay disjoint
            left -= len(starts)
        _run_loop(data, moves, body.aligned, a, b, buffers, reduce_fn, part, parts)
        if stop is not None:
            return


def _run_loop(data, moves, aligned, a, b, buffers, reduce_fn, part, parts) -> None:
    """One loop's moves (over elements [a, b) of the op), share `part` of `parts`. An index-aligned
    flat share runs a piece of about CHUNK_BYTES at a time, every move on that piece before the next
    piece: the moves that meet in one place (a ReduceScatter block's copy and adds, an AllGather
    block's copies) then find it in the cache, and each element still sees its moves in order."""
    views = [data.views(x, out, scratch, a, b) for x, out, scratch in buffers]
    rows = data.rows
    if not (rows or aligned):
        if part == 0:
            prog.execute(moves, views, reduce_fn)
        return
    n = b - a
    lo, hi = n * part // parts, n * (part + 1) // parts
    if lo == hi:
        return
    if rows:
        if parts == 1:
            prog.execute(moves, views, reduce_fn)
        else:
            prog.execute(moves, [[None if v is None else v[:, lo:hi] for v in vw] for vw in views], reduce_fn)
        return
    width = max(1, CHUNK_BYTES // _itemsize(views))
    for c in range(lo, hi, width):
        prog.execute(moves, views, reduce_fn, c, min(c + width, hi))


def _itemsize(views) -> int:
    return next(v.itemsize for vw in views for v in vw if v is not None)
