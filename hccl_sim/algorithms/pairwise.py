"""Pairwise AlltoAll (HCCL Pairwise.md): p-1 steps; at step k rank i sends its block for rank
i+k and receives rank i-k's block for it, so every port carries one transfer per step and no
rank is the target of many senders at once (no incast on a single RDMA port).

Blocks: input and output hold p rows of `unit` bytes; a rank's own block is a local copy made
during step 1. Cost (p-1)a + b * sum_k max_i n(i, i+k) = (p-1)(a + n/p b) for equal blocks,
n = whole send buffer. Any p.
"""
from __future__ import annotations

from hcomm.steps import Copy, Recv, Send

from .common import INPUT, OUTPUT, sl

NAME = "pairwise"
COLLECTIVES = ("alltoall",)


def alltoall(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    own = Copy(sl(INPUT, rank, rank + 1), sl(OUTPUT, rank, rank + 1), unit)
    if p == 1:
        return [(own,)]
    steps = []
    for k in range(1, p):
        dst, src = (rank + k) % p, (rank - k) % p
        step = (Send(dst, sl(INPUT, dst, dst + 1), unit), Recv(src, sl(OUTPUT, src, src + 1), unit))
        steps.append(step + (own,) if k == 1 else step)
    return steps
