"""Pairwise AlltoAll (HCCL Pairwise.md): p-1 steps; at step k rank i sends its block for rank
i+k and receives rank i-k's block for it, so every port carries one transfer per step and no
rank is the target of many senders at once (no incast on a single RDMA port).

Rows: block j of a rank's src (rows [j*rows, (j+1)*rows)) goes to rank j's dst at the sender's
block; the own block is a local copy made during step 1.
Cost (p-1)a + b * sum_k max_i n(i, i+k) = (p-1)(a + n/p b) for equal blocks, n = whole send buffer.
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, OUTPUT, StepBuilder

NAME = "pairwise"
COLLECTIVES = ("alltoall",)             # and its variable-size variants (alltoallv)
LEVELS = ("flat", "level1")
DESCRIPTION = "AlltoAll in p-1 steps, one peer per step (no incast)"


def alltoall(n: int, unit: int, src=INPUT, dst=OUTPUT, rows: int = 1, src_lo=0, dst_lo=0) -> list:
    r = np.arange(n)
    steps = []
    for k in range(1, max(n, 2)):
        b = StepBuilder()
        if k == 1:
            b.copies(r, unit, src, src_lo + r * rows, src_lo + (r + 1) * rows, dst, dst_lo + r * rows)
        if n > 1:
            to = (r + k) % n
            b.transfers(r, to, unit, src, src_lo + to * rows, src_lo + (to + 1) * rows, dst, dst_lo + r * rows)
        steps.append(b.build())
    return steps


def alltoallv(blocks, itemsize: int, src=INPUT, dst=OUTPUT) -> list:
    """AlltoAllV pairwise: step k moves block (i, i+k) of every rank i, each of its own length.
    `blocks`: (lengths, send offsets, receive offsets), each [sender, receiver], in elements of
    flat buffers; a pair with nothing to move has no transfer."""
    lengths, soff, doff = blocks
    n = len(lengths)
    r = np.arange(n)
    steps = []
    for k in range(1, max(n, 2)):
        b = StepBuilder()
        if k == 1:
            own = lengths[r, r] > 0
            b.copies(r[own], itemsize, src, soff[r, r][own], (soff[r, r] + lengths[r, r])[own], dst, doff[r, r][own])
        if n > 1:
            to = (r + k) % n
            length = lengths[r, to]
            go = length > 0
            b.transfers(r[go], to[go], itemsize, src, soff[r, to][go], (soff[r, to] + length)[go], dst, doff[r, to][go])
        steps.append(b.build())
    return steps
