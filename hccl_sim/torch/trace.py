"""A rank's communication as a trace `hccl-sim replay` prices on a bigger cluster
(hccl_sim.tools.trace_replay): the collectives the rank ran on each named group, in issue order.

Each op gives its name, its size as nccl-tests counts it (the op's global bytes: the AllReduce
buffer, the whole AllGather output, the whole ReduceScatter input, the whole AlltoAll send
buffer), its dtype, its group's mesh dimension and size, and its stream (one: a group's ops run
in issue order) with the op it follows.
"""
from __future__ import annotations

import json

import torch.distributed as dist

from topologies.errors import HcclError

from .. import canonical_op
from ..comm.record import TRACE_FORMAT as FORMAT


def export_trace(path, groups: dict, since: dict | None = None) -> dict:
    """Write (and return) this rank's trace of its ops on `groups` (mesh dimension -> group, None
    for the default group; a group named twice, as a 1-D mesh's dimension and the world, counts
    once, under its first name), skipping the first since[dim] ops of each."""
    from . import records
    seen, ops = set(), []
    sizes = {}
    for order, (dim, pg) in enumerate(groups.items()):
        pg = dist.group.WORLD if pg is None else pg
        if id(pg) in seen:
            continue
        seen.add(id(pg))
        sizes[dim] = pg.size()
        for k, rec in enumerate(records(pg)[(since or {}).get(dim, 0):]):
            ops.append((rec.start, order, k, dim, rec))
    ops.sort(key=lambda item: item[:3])
    trace = {"format": FORMAT, "ranks": dist.get_world_size(), "rank": dist.get_rank(), "groups": sizes,
             "ops": [{"op": _name(rec.name), "nbytes": int(rec.nbytes), "dtype": rec.dtype, "dim": dim,
                      "size": sizes[dim], "stream": 0, "after": i - 1}
                     for i, (*_, dim, rec) in enumerate(ops)]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, indent=1)
    return trace


def _name(name: str) -> str:
    """The collective's canonical name (all_gather -> allgather); sends, receives and barriers
    keep their own."""
    try:
        return canonical_op(name)
    except HcclError:
        return name
