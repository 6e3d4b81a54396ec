"""NB, Nonuniform Bruck (HCCL NB.md; templates reduce_scatter_nb.cc, all_gather_nb.cc).

ceil(log2 p) steps for any p, no extra volume when p is not a power of two:
- ReduceScatter, step s: send to r + 2^s the partials of the floor((p-1+2^s)/2^(s+1)) blocks
  r + 2^s + k 2^(s+1); receive the mirror set from r - 2^s and reduce it in (distances
  increasing, volume halving). Cost ceil(log2 p) a + (p-1)/p n(b+g).
- AllGather (Bruck): step s sends the 2^s blocks r, r-1, ... to r + 2^s (the last step of a
  non-power-of-two p sends p - 2^floor(log2 p)). Cost ceil(log2 p) a + (p-1)/p nb.
- AllReduce = ReduceScatter + AllGather: 2 ceil(log2 p) a + 2(p-1)/p nb + (p-1)/p ng.
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder, bounds, ceil_log2, held_rounds, local_copy
from .nhr import _add, halving_reducescatter, row_chunks

NAME = "NB"
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "scatter")
LEVELS = ("flat", "level1")
DESCRIPTION = "nonuniform Bruck: ceil(log2 p) steps, no extra volume for any p"
RUN_BY_RUN = True     # AllGather steps from each rank's run of blocks (False: from the block matrix)


def reducescatter(n: int, offs, unit: int, src=INPUT, acc=SCRATCH, out=OUTPUT, out_lo=None) -> list:
    return halving_reducescatter(n, offs, unit, src, acc, out, out_lo, None, direction=+1)


def allgather(n: int, offs, unit: int, buf=OUTPUT) -> list:
    offs = np.asarray(offs, dtype=np.int64)
    r = np.arange(n)
    L = ceil_log2(n)
    steps = []
    nonempty = RUN_BY_RUN and len(offs) == n + 1 and bool((offs[1:] > offs[:-1]).all())
    for s in range(L):
        P = 1 << s
        cnt = n - P if s == L - 1 and n & (n - 1) else P
        b = StepBuilder()
        if nonempty:
            steps.append(_runs_step(b, n, offs, unit, buf, r, P, cnt))
            continue
        for rows in row_chunks(n, cnt):       # bounded memory on thousands of servers
            rr = r[rows]
            blocks = (rr[:, None] - np.arange(cnt)[None, :]) % n
            _add(b, np.repeat(rr, cnt), np.repeat((rr + P) % n, cnt), unit, buf, offs, blocks, buf, offs[blocks], -1)
        steps.append(b.build())
    return steps


def _runs_step(b, n, offs, unit, buf, r, P, cnt):
    """Step s of the Bruck AllGather when no block is empty, without the (n x cnt) block matrix
    (n^2 blocks over the steps: minutes on 16,384 ranks): rank r's blocks r, r-1, ..., r-cnt+1
    are one run, which `_add` sends as one transfer, or, where the run wraps past block 0, as two,
    the low part [0, r] first (merge_runs orders a pair's transfers by offset; cnt < n keeps the
    parts apart). The same transfers in the same order (tests check it)."""
    first = r - cnt + 1
    wrap = first < 0
    reps = 1 + wrap.astype(np.int64)
    at = np.cumsum(reps) - reps                   # where each rank's (first) transfer goes
    total = int(reps.sum())
    slo, shi = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64)
    slo[at] = np.where(wrap, offs[0], offs[np.maximum(first, 0)])
    shi[at] = offs[r + 1]
    slo[at[wrap] + 1] = offs[first[wrap] + n]
    shi[at[wrap] + 1] = offs[n]
    src = np.repeat(r, reps)
    b.transfers(src, (src + P) % n, unit, buf, slo, shi, buf, slo, rbuf=-1, rlo=0)
    return b.build()


def allreduce(n: int, N: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    offs = bounds(N, n)
    return reducescatter(n, offs, unit, src, dst, dst, offs[:-1]) + allgather(n, offs, unit, dst)


def scatter_rounds(n: int, root: int) -> list:
    """Scatter (HCCL scatter_nb.cc): ceil(log2 n) steps; in step s the ranks within 2^s above the
    root (those below n - 2^s in the last step) each send to the rank 2^s above them the blocks of
    it and of every 2^(s+1)-th rank above it, floor((n - 1 + 2^s) / 2^(s+1)) of them, as far as
    they hold them."""
    L = ceil_log2(n)
    steps = []
    for s in range(L):
        d = 1 << s
        cnt = (n - 1 + d) // (2 * d)
        triples = []
        for delta in range(min(d, n)):
            if s == L - 1 and delta >= n - d:
                continue
            rank = (root + delta) % n
            to = (rank + d) % n
            triples.append((rank, to, [(to + k * 2 * d) % n for k in range(cnt)]))
        steps.append(triples)
    return held_rounds(n, root, steps)
