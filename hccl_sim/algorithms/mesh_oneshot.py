"""One-shot full mesh (the open-source HCCL's Mesh1D one-shot templates on the Ascend 950,
ins_temp_all_reduce_mesh_1D_one_shot.cc; docs/references.md §6.13): every rank writes its whole
input to every peer at once and reduces what it receives itself.

- AllReduce: one step; each rank copies its input to its output and the n - 1 peers' inputs are
  reduced in: a + n b (each of the n - 1 copies of the input over its own link, at once) +
  (n-1) n g (reductions serial). Fewer steps than the two-shot mesh (algorithms.mesh: RS + AG),
  n - 1 times the bytes: HCCL runs it for small data (AllReduce <= 8 MiB on one 950 server).
- Reduce: one step; every rank writes its input to the root, which reduces them (HCCL's
  AicpuReduceSoleMesh below 8 MiB).
Any rank count: nothing is halved or paired.
"""
from __future__ import annotations

import numpy as np

from . import mesh
from .common import INPUT, OUTPUT, local_copy

NAME = "mesh_oneshot"
COLLECTIVES = ("allreduce", "reduce")
# Inside a server only (the 950's level0 one-shot templates): not a flat choice of synthetic
# presets' selection, which compares flat and level1 algorithms.
LEVELS = ("level0",)
DESCRIPTION = "every rank writes its whole input to every peer (or the root) at once, which reduces it"


def allreduce(n: int, N: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    everyone = np.arange(n)
    return mesh.reducescatter(n, (np.zeros(n, dtype=np.int64), np.full(n, N, dtype=np.int64)), unit, src, dst, dst,
                              np.zeros(n, dtype=np.int64), owner=everyone)


def reduce(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    return mesh.reducescatter(n, (np.zeros(1, dtype=np.int64), np.full(1, N, dtype=np.int64)), unit, src, dst, dst,
                              np.zeros(1, dtype=np.int64), owner=np.array([root]))
