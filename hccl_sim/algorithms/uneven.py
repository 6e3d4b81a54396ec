"""The V variants of AllGather and ReduceScatter (HCCL's AllGatherV, ReduceScatterV) over any
block algorithm: one loop's blocks, one per rank and each of its own length, placed where a
block algorithm can run on them.

Block algorithms run on blocks that lie end to end in rank order (bounds); ring and mesh also on
blocks anywhere ((lo, hi) per rank). So a loop runs in place on the user's buffer where its
blocks lie end to end there (HCCL's default displacements, one loop), or where the algorithm
takes blocks anywhere; otherwise, as HCCL's CCL buffer does, on a copy in scratch with the
blocks end to end:
- AllGatherV: each rank copies its block into place, the algorithm gathers the blocks in place,
  and (in scratch) every rank copies every block out to its displacement.
- ReduceScatterV: the algorithm reduces the blocks from the input (in scratch: from a copy of
  them past the scratch area it accumulates in) into each rank's output.
Empty blocks are empty ranges; positions are in elements of the flat buffers.
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder, rebuffered


def end_to_end(lo, lengths):
    """The bounds of blocks at `lo` when the non-empty ones lie end to end in rank order, else None."""
    lo, lengths = np.asarray(lo, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    go = np.flatnonzero(lengths > 0)
    base = int(lo[go[0]]) if len(go) else 0
    bounds = base + np.concatenate(([0], np.cumsum(lengths)))
    return bounds if np.array_equal(bounds[:-1][go], lo[go]) else None


def allgatherv(lengths, user_lo, in_lo, itemsize: int, gather, anywhere: bool = False) -> tuple:
    """(program, in_place) of one AllGatherV loop: rank i's `lengths[i]` elements at its input's
    `in_lo` go to user_lo[i] in every rank's output. `gather(buf, offs)`: the in-place AllGather
    of blocks `offs` (bounds; (lo, hi) when `anywhere`) in buffer buf."""
    lengths, user_lo = np.asarray(lengths, dtype=np.int64), np.asarray(user_lo, dtype=np.int64)
    p = len(lengths)
    r = np.arange(p)
    bounds = end_to_end(user_lo, lengths)
    in_place = anywhere or bounds is not None
    if in_place:
        buf = OUTPUT
        lo = user_lo if anywhere else bounds[:-1]
        offs = (lo, lo + lengths) if anywhere else bounds
    else:
        buf = SCRATCH
        offs = np.concatenate(([0], np.cumsum(lengths)))
        lo = offs[:-1]
    go = lengths > 0
    steps = []
    if go.any():
        steps.append(StepBuilder().copies(r[go], itemsize, INPUT, np.full(int(go.sum()), in_lo), (in_lo + lengths)[go],
                                          buf, lo[go]).build())
    steps += gather(buf, offs)
    if not in_place and go.any():
        blk = np.flatnonzero(go)
        rank = np.repeat(r, len(blk))
        blk = np.tile(blk, p)
        steps.append(StepBuilder().copies(rank, itemsize, SCRATCH, lo[blk], lo[blk] + lengths[blk], OUTPUT,
                                          user_lo[blk]).build())
    return steps, in_place


def reducescatterv(lengths, user_lo, out_lo, itemsize: int, scatter, anywhere: bool = False) -> tuple:
    """(program, in_place) of one ReduceScatterV loop: block j (`lengths[j]` elements at
    user_lo[j] of every rank's input) is reduced into rank j's output at `out_lo`.
    `scatter(src, offs, acc, out, out_lo)`: the ReduceScatter of blocks `offs` (bounds; (lo, hi)
    when `anywhere`) of src, partials in acc at the blocks' places."""
    lengths, user_lo = np.asarray(lengths, dtype=np.int64), np.asarray(user_lo, dtype=np.int64)
    p = len(lengths)
    at = np.full(p, out_lo, dtype=np.int64)
    bounds = end_to_end(user_lo, lengths)
    if anywhere or bounds is not None:
        offs = (user_lo, user_lo + lengths) if anywhere else bounds
        return scatter(INPUT, offs, SCRATCH, OUTPUT, at), True
    offs = np.concatenate(([0], np.cumsum(lengths)))
    total = int(offs[-1])
    go = np.flatnonzero(lengths > 0)
    rank = np.repeat(np.arange(p), len(go))
    blk = np.tile(go, p)
    copy_in = StepBuilder().copies(rank, itemsize, INPUT, user_lo[blk], user_lo[blk] + lengths[blk], SCRATCH,
                                   total + offs[blk]).build()
    body = rebuffered(scatter(INPUT, offs, SCRATCH, OUTPUT, at), INPUT, SCRATCH, total)
    return ([copy_in] if len(go) else []) + body, False
