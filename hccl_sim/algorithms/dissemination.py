"""Barrier by dissemination: ceil(log2 p) rounds; in round i rank r notifies r + 2^i and waits
for r - 2^i. After the last round every rank has heard, directly or not, from every other.
Zero-byte messages, so the cost is ceil(log2 p) a (plus notify costs on hardware presets).
"""
from __future__ import annotations

from hcomm.steps import Recv, Send

from .common import INPUT, sl

NAME = "dissemination"
COLLECTIVES = ("barrier",)


def barrier(rank: int, p: int, n: int = 0, unit: int = 0, root: int = 0) -> list:
    steps = []
    d = 1
    while d < p:
        steps.append((Send((rank + d) % p, sl(INPUT, 0, 0), 0), Recv((rank - d) % p, sl(INPUT, 0, 0), 0)))
        d <<= 1
    return steps
