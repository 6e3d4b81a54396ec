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


def _allgather(mod, p, n, unit, root):
    r, rows = np.arange(p), np.arange(p + 1)
    return [StepBuilder().copies(r, unit, INPUT, 0, 1, OUTPUT, r).build()] + mod.allgather(p, rows, unit, OUTPUT)


# How a flat algorithm module builds each collective over all p ranks: one table, keyed by the
# collective's name (hccl_sim.collectives' classes build their other levels themselves; this is
# the algorithms' side of the interface, which knows no collective class).
FLAT = {
    "barrier": lambda mod, p, n, unit, root: mod.barrier(p),
    "allreduce": lambda mod, p, n, unit, root: mod.allreduce(p, n, unit, INPUT, OUTPUT),
    "broadcast": lambda mod, p, n, unit, root: mod.broadcast(p, n, unit, root, INPUT, OUTPUT),
    "reduce": lambda mod, p, n, unit, root: mod.reduce(p, n, unit, root, INPUT, OUTPUT),
    "allgather": _allgather,
    "reducescatter": lambda mod, p, n, unit, root: mod.reducescatter(p, np.arange(p + 1), unit, INPUT, SCRATCH, OUTPUT,
                                                                     np.zeros(p, dtype=np.int64)),
    "alltoall": lambda mod, p, n, unit, root: mod.alltoall(p, unit),
    "scatter": lambda mod, p, n, unit, root: relay_scatter(mod.scatter_rounds(p, root), np.arange(p + 1), unit, root,
                                                           INPUT, SCRATCH, OUTPUT),
}


def flat_program(collective: str, algo: str, p: int, n: int, unit: int, root: int = 0) -> list:
    """The program of `collective` over all p ranks with one flat algorithm.

    Vector collectives: n elements of `unit` bytes. Block collectives: p rank blocks of `unit` bytes."""
    mod = registry.module(algo)         # an unknown algorithm is said first
    build = FLAT.get(collective)
    if build is None:
        raise HcclError("E_PARA", f"unknown collective {collective!r}")
    return build(mod, p, n, unit, root)
