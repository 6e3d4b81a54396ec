"""Barrier by dissemination: ceil(log2 p) rounds; in round i rank r notifies r + 2^i and waits
for r - 2^i. After the last round every rank has heard, directly or not, from every other.
Zero-byte messages, so the cost is ceil(log2 p) a (plus notify costs on hardware presets).
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, StepBuilder

NAME = "dissemination"
COLLECTIVES = ("barrier",)
LEVELS = ("flat",)
DESCRIPTION = "barrier in ceil(log2 p) notify rounds"


def barrier(n: int) -> list:
    r = np.arange(n)
    steps = []
    d = 1
    while d < n:
        steps.append(StepBuilder().transfers(r, (r + d) % n, 0, INPUT, 0, 0, INPUT, 0).build())
        d <<= 1
    return steps
