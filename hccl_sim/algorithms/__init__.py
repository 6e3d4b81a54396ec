"""Collective algorithms as programs: one module per algorithm, vectorised over ranks.

Flat algorithms run over all ranks (synthetic topologies, or a level of a hierarchy):
ring, H-D_R (halving_doubling), NHR, NB, fullmesh (mesh), pairwise, dissemination (barrier).
`hierarchy` composes them the way HCCL does on servers (level0 inside, level1 across), and
`pipeline` overlaps the two levels. Builders are pure: no data, no I/O, no clocks.
"""
from __future__ import annotations

import numpy as np

from . import dissemination, halving_doubling, hierarchy, mesh, nb, nhr, pairwise, pipeline, ring
from .common import INPUT, OUTPUT, SCRATCH, StepBuilder

FLAT = {m.NAME: m for m in (ring, halving_doubling, nhr, nb, mesh, pairwise)}
LEVEL1 = ("ring", "H-D_R", "NHR", "NB", "pipeline")
BLOCK_COLLECTIVES = ("allgather", "reducescatter", "alltoall")
VECTOR_COLLECTIVES = ("allreduce", "broadcast", "reduce")
COLLECTIVES = BLOCK_COLLECTIVES + VECTOR_COLLECTIVES


def supports(algo: str, collective: str) -> bool:
    return algo in FLAT and collective in FLAT[algo].COLLECTIVES


def flat_program(collective: str, algo: str, p: int, n: int, unit: int, root: int = 0) -> list:
    """The program of `collective` over all p ranks with one flat algorithm.

    Vector collectives: n elements of `unit` bytes. Block collectives: p rank blocks of `unit` bytes."""
    if collective == "barrier":
        return dissemination.barrier(p)
    mod = FLAT[algo]
    if collective == "allreduce":
        return mod.allreduce(p, n, unit, INPUT, OUTPUT)
    if collective == "broadcast":
        return mod.broadcast(p, n, unit, root, INPUT, OUTPUT)
    if collective == "reduce":
        return mod.reduce(p, n, unit, root, INPUT, OUTPUT)
    rows = np.arange(p + 1)
    if collective == "allgather":
        r = np.arange(p)
        return [StepBuilder().copies(r, unit, INPUT, 0, 1, OUTPUT, r).build()] + mod.allgather(p, rows, unit, OUTPUT)
    if collective == "reducescatter":
        return mod.reducescatter(p, rows, unit, INPUT, SCRATCH, OUTPUT, np.zeros(p, dtype=np.int64))
    if collective == "alltoall":
        return mod.alltoall(p, unit)
    raise ValueError(collective)
