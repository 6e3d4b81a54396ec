"""The algorithm registry: every algorithm by its HCCL name, with what it can run and where.

One entry per algorithm module: each module declares NAME, DESCRIPTION, COLLECTIVES and LEVELS
next to its builders, NOT_AT where HCCL does not run a collective it builds at some level, and
STAGED = False when its program reads and writes the user's buffers itself (no CCL-buffer staging),
loop_block_bytes(buffsize) where it cuts a block collective's data into CCL-buffer loops its
own way (the bytes of each block one loop moves), and block_parts(p, length, itemsize) where it
cuts a block collective's blocks below the row a program addresses (parts side by side, each over
its range of every block).
Levels: "flat" (over all ranks of a synthetic topology), "level0" (inside a server), "level1"
(among the same-index cards of all servers; pipeline spans both levels); on an A3 SuperPoD,
level1 is inside a superpod and level2 among superpods, and what runs there is A3's selection
(selection/hccl_a3.py) over the level1 algorithms. Selection policies
(hccl_sim.selection) and the planner read this table; nothing else lists algorithms. Adding an
algorithm is its module plus one line in MODULES.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from topologies.errors import HcclError

from . import (birs, dissemination, double_ring, grouped_mesh, halving_doubling, mesh, mesh_chunk, mesh_oneshot,
               mesh_rounds, nb, nhr, pairwise, pipeline, ring, star)

MODULES = (ring, halving_doubling, nhr, nb, mesh, pairwise, pipeline, star, dissemination, double_ring, grouped_mesh,
           mesh_oneshot, birs, mesh_rounds, mesh_chunk)


@dataclass(frozen=True)
class Algorithm:
    name: str                 # HCCL's token or log name: "ring", "H-D_R", "NHR", ...
    module: ModuleType        # its builders: one function per collective it supports
    description: str
    collectives: tuple
    levels: tuple
    not_at: dict              # level -> collectives the module builds but HCCL does not run there
    staged: bool = True       # False: it reads the user's input and writes the output itself (STAGED)
    loop_block_bytes: object = None   # buffsize -> bytes of each block per CCL-buffer loop, or None
    block_parts: object = None        # (p, length, itemsize) -> a block collective's parts, or None

    def supports(self, collective: str, level: str = "flat") -> bool:
        return (collective in self.collectives and level in self.levels
                and collective not in self.not_at.get(level, ()))

    def runs_flat(self, collective: str) -> bool:
        """Whether it runs `collective` over every rank: at a level a token asks for, or, for an
        algorithm only selection runs (no levels), any collective it builds."""
        return (self.supports(collective, "flat") or self.supports(collective, "level0")
                or (not self.levels and collective in self.collectives))


ALGORITHMS = {m.NAME: Algorithm(m.NAME, m, m.DESCRIPTION, tuple(m.COLLECTIVES), tuple(m.LEVELS),
                                dict(getattr(m, "NOT_AT", {})), getattr(m, "STAGED", True),
                                getattr(m, "loop_block_bytes", None), getattr(m, "block_parts", None))
              for m in MODULES}


def get(name: str) -> Algorithm:
    algo = ALGORITHMS.get(name)
    if algo is None:
        raise HcclError("E_PARA", f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return algo


def supporting(collective: str, level: str = "flat") -> list:
    """Names of the algorithms that run `collective` at `level`, in registry order."""
    return [a.name for a in ALGORITHMS.values() if a.supports(collective, level)]


def supports(name: str, collective: str, level: str = "flat") -> bool:
    algo = ALGORITHMS.get(name)
    return algo is not None and algo.supports(collective, level)


def module(name: str) -> ModuleType:
    return get(name).module
