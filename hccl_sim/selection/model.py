"""The `model` policy: replay every candidate on this emulator's timing model, take the fastest.

Candidates are the registry's algorithms for the collective at that level (pipeline where HCCL
would run it). Decisions are cached in the cost model, keyed by everything the timing depends on
(the call without its algo argument, the buffer size) and nothing else.
"""
from __future__ import annotations

from ..algorithms import registry
from . import hccl


def candidates(ctx, flat: bool) -> list:
    name = ctx.name
    if flat:
        return registry.supporting(name, "flat")
    names = registry.supporting(name, "level1")
    if name == "alltoall":
        return ["pairwise"]
    return [n for n in names if n != "pipeline" or hccl.pipeline_eligible(name, ctx.topo, ctx.servers)]


def choose(ctx, flat: bool, level0) -> str:
    from . import Choice
    sig = ctx.signature
    key = ("model", sig.name, sig.shape, sig.dtype, sig.redop, sig.root, ctx.config.buffsize_mb, ctx.itemsize)
    best = ctx.cache.get(key)
    if best is None:
        best_time = None
        for algo in candidates(ctx, flat):
            t = ctx.price(Choice(flat, level0, algo))
            if best_time is None or t < best_time:
                best, best_time = algo, t
        ctx.cache[key] = best
    return best
