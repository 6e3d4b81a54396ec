"""Star (HCCL Star.md; AlgTypeLevel1 STAR, level0 NP_STAR): rooted ops in one step.

- Broadcast: the root sends its whole buffer to every other rank at once (and copies it into its
  own output). Cost a + n b on a topology where every pair has a link of its own (the root's p-1
  sends leave by separate ports); where they share the root's port they serialise there.
- Reduce: every other rank sends its whole buffer to the root at once; the root copies its own
  contribution into place and reduces the p-1 arrivals into it. Cost a + n b + (p-1) n g.
Bytes on the wire: (p-1) n, all at the root. Any p works (no power-of-two structure); p = 1 is a
local copy. Zero-copy safety: senders expose their input, which nobody writes.
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, OUTPUT, StepBuilder, local_copy

NAME = "star"
DESCRIPTION = "one-step rooted Broadcast/Reduce: the root exchanges with every rank at once"
COLLECTIVES = ("broadcast", "reduce")
LEVELS = ("flat", "level1")


def broadcast(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    others = np.array([r for r in range(n) if r != root], dtype=np.int64)
    b = StepBuilder().transfers(np.full(n - 1, root), others, unit, src, 0, N, dst, 0)
    if src != dst:
        b.copies([root], unit, src, 0, N, dst, 0)
    return [b.build()]


def reduce(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    """The root ends with the reduction in dst; the other ranks' dst is untouched."""
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    others = np.array([r for r in range(n) if r != root], dtype=np.int64)
    b = StepBuilder()
    if src != dst:
        b.copies([root], unit, src, 0, N, dst, 0)
    b.transfers(others, np.full(n - 1, root), unit, src, 0, N, dst, 0, rbuf=dst, rlo=0)
    return [b.build()]
