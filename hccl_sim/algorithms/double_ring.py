"""Double ring: HCCL's level0 inside an A3 server (TOPO_TYPE_NP_DOUBLE_RING, DEV_TYPE_910_93).

Source: hcomm src/legacy/ascend910 (reference notes on A3): GetRingsOrderByTopoType gives ring 0
the server's dies in rank order 0, 1, ..., n-1 and ring 1 the same ring reversed (0, n-1, ..., 1);
MutliSegSlicePrepare cuts every rank's slice in two, the first RoundUp(ceil(slice / 2), 128 B)
bytes to ring 0 and the rest to ring 1; the aligned double-ring templates run both rings at once
on two streams, ring 0 pulling from the left neighbour and ring 1 from the right. With the SIO
pairs (2k, 2k+1) adjacent in rank order, every die drives its SIO link and one UB (HCCS switch)
link in both directions at once, and a step takes the slower of the two.

Here: `halves` is the 128-byte split; the caller (algorithms.superpod) runs the whole program on
each half of a loop's elements (each rank block's columns, for block collectives), ring 0's half
with `order(n, 0)` and ring 1's with `order(n, 1)`, side by side. Each ring is an ordinary ring
(algorithms.ring) over the dies in that order, every die owning its own block whatever its
position. HCCL's Broadcast scatters along the rings and its Reduce gathers in the root's server:
`scatter` and `gather` are those chains.

Cost per ring phase on n dies and a half of h bytes: (n - 1) steps of h / n over the slower of
the SIO and UB links (plus a reduction on ReduceScatter), i.e. half of a single ring's time.
"""
from __future__ import annotations

import numpy as np

from .common import StepBuilder, blocks

NAME = "double_ring"
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce")
LEVELS = ("level0",)
DESCRIPTION = "A3 level0: two rings over a server's dies in opposite directions, half of every slice each"
MIN_SLICE_ALIGN = 128            # HCCL_MIN_SLICE_ALIGN, bytes


def order(n: int, ring: int, first: int = 0) -> np.ndarray:
    """The dies of ring `ring` (0 forward, 1 reversed) from position 0 = die `first`."""
    step = 1 if ring == 0 else -1
    return (first + step * np.arange(n)) % n


def halves(length: int, itemsize: int) -> list:
    """(start, stop) element ranges of ring 0 and ring 1 for a slice of `length` elements: the
    first RoundUp(ceil(bytes / 2), 128 B), the rest (an empty part is dropped)."""
    nbytes = length * itemsize
    if MIN_SLICE_ALIGN % itemsize == 0:
        half = -(-(-(-nbytes // 2)) // MIN_SLICE_ALIGN) * MIN_SLICE_ALIGN // itemsize
    else:
        half = -(-length // 2)
    half = min(half, length)
    return [(a, b) for a, b in ((0, half), (half, length)) if b > a] or [(0, 0)]


def scatter(n: int, offs, unit: int, src, dst) -> list:
    """A chain from position 0: step t, positions 0..t pass on the block of position n-1-t+j, so
    the farthest block leaves first and every block arrives at step n-2. Position 0 sends from src
    (and copies its own block to dst); the others forward from dst."""
    lo, hi = blocks(offs)
    steps = []
    for t in range(n - 1):
        j = np.arange(t + 1)
        blk = n - 1 - t + j
        b = StepBuilder().transfers(j, j + 1, unit, np.where(j == 0, src, dst), lo[blk], hi[blk], dst, lo[blk])
        if t == 0 and src != dst:
            b.copies([0], unit, src, lo[0], hi[0], dst, lo[0])
        steps.append(b.build())
    return steps


def gather(n: int, offs, unit: int, buf) -> list:
    """The chain reversed, in place in buf: step t, position j+1 passes block j+1+t to position j
    (j <= n-2-t), so position 0 ends with every block."""
    lo, hi = blocks(offs)
    steps = []
    for t in range(n - 1):
        j = np.arange(n - 1 - t)
        blk = j + 1 + t
        steps.append(StepBuilder().transfers(j + 1, j, unit, buf, lo[blk], hi[blk], buf, lo[blk]).build())
    return steps
