"""Collective algorithms as schedules: one module per algorithm, one function per collective.

Every builder has the signature `f(rank, p, n, unit, root) -> list of steps` (hcomm.steps):
`n` counts units along the buffer's first axis for vector collectives (allreduce, broadcast,
reduce: n elements of `unit` bytes) and is ignored by block collectives (allgather,
reducescatter, alltoall), whose buffers hold p rank blocks of `unit` bytes each.
Builders are pure: no data, no I/O, no clocks.
"""
from __future__ import annotations

from functools import lru_cache

from . import dissemination, halving_doubling, pairwise, ring

ALGORITHMS = {m.NAME: m for m in (ring, halving_doubling, pairwise, dissemination)}
BLOCK_COLLECTIVES = ("allgather", "reducescatter", "alltoall")
VECTOR_COLLECTIVES = ("allreduce", "broadcast", "reduce")


def supports(algo: str, collective: str) -> bool:
    return algo in ALGORITHMS and collective in ALGORITHMS[algo].COLLECTIVES


@lru_cache(maxsize=65536)
def schedule(algo: str, collective: str, rank: int, p: int, n: int, unit: int, root: int = 0) -> tuple:
    """One rank's steps (cached: the same op repeats every iteration)."""
    return tuple(getattr(ALGORITHMS[algo], collective)(rank, p, n, unit, root))


def schedules(algo: str, collective: str, p: int, n: int, unit: int, root: int = 0) -> list:
    return [schedule(algo, collective, r, p, n, unit, root) for r in range(p)]
