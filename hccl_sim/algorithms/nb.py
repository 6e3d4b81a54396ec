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

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder, bounds, ceil_log2, local_copy
from .nhr import _add, halving_reducescatter, row_chunks

NAME = "NB"
COLLECTIVES = ("allreduce", "reducescatter", "allgather")
LEVELS = ("flat", "level1")
DESCRIPTION = "nonuniform Bruck: ceil(log2 p) steps, no extra volume for any p"


def reducescatter(n: int, offs, unit: int, src=INPUT, acc=SCRATCH, out=OUTPUT, out_lo=None) -> list:
    return halving_reducescatter(n, offs, unit, src, acc, out, out_lo, None, direction=+1)


def allgather(n: int, offs, unit: int, buf=OUTPUT) -> list:
    offs = np.asarray(offs, dtype=np.int64)
    r = np.arange(n)
    L = ceil_log2(n)
    steps = []
    for s in range(L):
        P = 1 << s
        cnt = n - P if s == L - 1 and n & (n - 1) else P
        b = StepBuilder()
        for rows in row_chunks(n, cnt):       # bounded memory on thousands of servers
            rr = r[rows]
            blocks = (rr[:, None] - np.arange(cnt)[None, :]) % n
            _add(b, np.repeat(rr, cnt), np.repeat((rr + P) % n, cnt), unit, buf, offs, blocks, buf, offs[blocks], -1)
        steps.append(b.build())
    return steps


def allreduce(n: int, N: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    offs = bounds(N, n)
    return reducescatter(n, offs, unit, src, dst, dst, offs[:-1]) + allgather(n, offs, unit, dst)
