"""HCCL's Scatter selection (scatter_operator.cc, coll_scatter_*_executor.cc, read at
libochao-huawei/hcomm@8958adbf; docs/references.md §6.11).

Level1 is ring unless HCCL_ALGO's `scatter` setting asks for NHR or NB (the operator forces any
other algorithm to ring). One rank: a copy. Servers with unequal card counts: ScatterComm, that
level1 algorithm over every rank. Otherwise level0 by the hardware: the mesh on 910B
(ScatterMesh), the ring on A3 (ScatterRingFor91093, modelled with level1 over every server where
HCCL adds a level2 among superpods), and 910A's own (its 8-card ring, its 4-card mesh). Synthetic
presets: the flat algorithm asked for among ring, NHR, NB and fullmesh, else ring.
"""
from __future__ import annotations

from topologies.errors import HcclError

from . import hccl

LEVEL1 = ("ring", "NHR", "NB")


def choose(ctx, token):
    from . import Choice
    srv, topo = ctx.servers, ctx.topo
    if token in hccl.NOT_BUILT:
        raise HcclError("E_NOT_SUPPORT", f"algorithm {token} is accepted by HCCL but not built by hccl-sim; "
                        "Scatter runs ring, NHR, NB or fullmesh")
    if ctx.flat:
        if token in LEVEL1 + ("fullmesh", None):
            return Choice(True, None, token or "ring")
        return Choice(True, None, "ring", f"HCCL's Scatter runs ring, not {token}")
    level1 = token if token in ("NHR", "NB") else "ring"
    note = None if token in (None, "ring", "NHR", "NB") else f"HCCL's Scatter runs level1 {token} as ring"
    if topo.num_ranks == 1 or not srv.equal:
        why = None if topo.num_ranks == 1 else "servers with unequal card counts: HCCL's ScatterComm over every rank"
        return Choice(True, None, level1, "; ".join(n for n in (why, note) if n) or None)
    if srv.m == 1:
        level1 = None
        note = None if token is None else f"one server: no level1, {token} not used"
    elif ctx.pods is not None and ctx.pods.shape[0] > 1:
        note = "; ".join(n for n in (note, "level1 over every server (HCCL's level2 among superpods is not "
                                           "modelled for Scatter)") if n)
    if srv.K == 1:
        level0 = None
    elif ctx.pods is not None:
        level0 = "ring"
    else:
        level0 = hccl.level0_for(topo, srv)
    return Choice(False, level0, level1, note)
