"""Collective algorithms as programs: one module per algorithm, vectorised over ranks.

Flat algorithms run over all ranks (synthetic topologies, or a level of a hierarchy):
ring, H-D_R (halving_doubling), NHR, NB, fullmesh (mesh), pairwise, star, dissemination
(barrier); `registry` lists them with their collectives and levels. `hierarchy` composes them the
way HCCL does on servers (level0 inside, level1 across), and `pipeline` overlaps the two levels.
Builders are pure: no data, no I/O, no clocks.
"""
from __future__ import annotations

import numpy as np

from topologies.errors import HcclError

from . import registry
from .common import INPUT, OUTPUT, SCRATCH, StepBuilder, relay_scatter


def flat_program(collective: str, algo: str, p: int, n: int, unit: int, root: int = 0) -> list:
    """The program of `collective` over all p ranks with one flat algorithm.

    Vector collectives: n elements of `unit` bytes. Block collectives: p rank blocks of `unit` bytes."""
    mod = registry.module(algo)
    if collective == "barrier":
        return mod.barrier(p)
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
    if collective == "scatter":
        return relay_scatter(mod.scatter_rounds(p, root), rows, unit, root, INPUT, SCRATCH, OUTPUT)
    raise HcclError("E_PARA", f"unknown collective {collective!r}")

