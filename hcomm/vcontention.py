"""Steps whose transfers share ports or a receiver's reduce engine, vectorised (hcomm.vtiming).

Ports serve a step's transfers in the algorithm's issue order (a transfer still starts no earlier
than it is ready), so the service order is structural: each transfer's predecessor on its egress
and ingress port is found once per step structure, the transfers are levelled along those chains,
and each level is one vectorised update. A port is free once its last transfer has held it (bytes /
the port's rate); where that is shorter than the transfer's wire time (a port one pair cannot fill),
a transfer also waits for the wire end of its pair's last transfer, which is earlier on its egress
chain and so already priced. Then every receiver's reductions run one batch per
sender, in the order the batches' last transfers were served, exactly as the event-driven
reference (hcomm.timing) serves them.
"""
from __future__ import annotations

import numpy as np

_I64 = np.int64


def _predecessor(resource, order_pos, valid=None):
    """For each transfer, the transfer served just before it on the same resource (or -1)."""
    n = len(resource)
    idx = np.arange(n) if valid is None else np.flatnonzero(valid)
    pred = np.full(n, -1, dtype=_I64)
    if len(idx) < 2:
        return pred
    o = idx[np.lexsort((order_pos[idx], resource[idx]))]
    same = resource[o[1:]] == resource[o[:-1]]
    pred[o[1:][same]] = o[:-1][same]
    return pred


def _levels(p_out, p_in) -> list:
    """The transfers levelled along their port chains (each transfer one level past the later of
    its two predecessors, -1 for none), as one sorted index array per level: Kahn's layering, a
    level per iteration, each touching only the transfers the last level freed, so a step whose
    ports serve long chains (A3's level1 at hundreds of servers) costs O(transfers) array work
    plus a few array calls per level, not a pass over every transfer per level."""
    n = len(p_out)
    waiting = (p_out >= 0).astype(_I64) + (p_in >= 0)
    succ = np.full((2, n), -1, dtype=_I64)     # the transfer served next on each port
    for k, pred in enumerate((p_out, p_in)):
        has = np.flatnonzero(pred >= 0)
        succ[k, pred[has]] = has
    levels = []
    frontier = np.flatnonzero(waiting == 0)
    while len(frontier):
        levels.append(frontier)
        nxt = succ[:, frontier].reshape(-1)
        nxt = nxt[nxt >= 0]
        np.subtract.at(waiting, nxt, 1)         # a transfer freed by both its predecessors counts twice
        nxt = np.unique(nxt)
        frontier = nxt[waiting[nxt] == 0]
    if sum(len(e) for e in levels) != n:
        raise RuntimeError("port chains with a cycle: a transfer served before itself")
    return levels


class _Order:
    """The service order of a contended step and everything derived from it."""
    __slots__ = ("order", "pos", "p_out", "p_in", "p_pair", "levels", "unit", "units", "udst", "chains")


def _struct_rank(pr):
    """The tie-break after ready time: the transfer's issue order in its step (its listing)."""
    rank = getattr(pr, "_struct", None)
    if rank is None:
        rank = pr._struct = pr.listing
    return rank


def _order_for(pr, ready):
    """Ports serve a step's transfers in the algorithm's issue order, whatever their ready times
    (a transfer still starts no earlier than it is ready), so the order is structural: it is
    computed once per step structure."""
    cached = getattr(pr, "_order", None)
    if cached is not None:
        return cached
    struct = _struct_rank(pr)
    od = _Order()
    n = pr.n
    od.order = np.argsort(struct, kind="stable")
    od.pos = np.empty(n, dtype=_I64)
    od.pos[od.order] = np.arange(n)
    od.p_out = _predecessor(pr.eport, od.pos)
    od.p_in = _predecessor(pr.iport, od.pos)
    od.p_pair = None
    if pr.outrun:
        od.p_pair = _predecessor(pr.eport * (int(pr.iport.max()) + 1) + pr.iport, od.pos)
    od.levels = []
    for e in _levels(od.p_out, od.p_in):
        preds = [(pred[e], pred[e] >= 0) for pred in (od.p_out, od.p_in)]
        pair = None
        if od.p_pair is not None:
            pe = od.p_pair[e]
            has = pe >= 0
            pair = (pe[has], has) if has.any() else None
        od.levels.append((e, [(pe[has], has) for pe, has in preds], pair))
    reducing = np.flatnonzero(pr.rflag)
    od.unit = None
    if len(reducing):
        # batches: the reducing transfers of one (sender, receiver) pair
        pair = pr.src[reducing] * (int(pr.dst.max()) + 1) + pr.dst[reducing]
        uniq, unit = np.unique(pair, return_inverse=True)
        u = len(uniq)
        upos = np.full(u, -1, dtype=_I64)
        np.maximum.at(upos, unit, od.pos[reducing])
        cost = np.zeros(u, dtype=_I64)
        np.add.at(cost, unit, pr.red[reducing])
        udst = np.zeros(u, dtype=_I64)
        udst[unit] = pr.dst[reducing]
        od.unit, od.units, od.udst = (reducing, unit), (u, cost), udst
        costly = np.flatnonzero(cost > 0)
        od.chains = []
        if len(costly):
            o = costly[np.lexsort((upos[costly], udst[costly]))]
            first = np.ones(len(o), dtype=bool)
            first[1:] = udst[o[1:]] != udst[o[:-1]]
            rank_in_dst = np.arange(len(o)) - np.maximum.accumulate(np.where(first, np.arange(len(o)), 0))
            for j in range(int(rank_in_dst.max()) + 1):
                sel = np.flatnonzero(rank_in_dst == j)
                od.chains.append((o[sel], o[sel - 1] if j else None))
    pr._order = od
    return od


def maximum_at(out, index, values):
    """np.maximum.at on the last axis of `out` (one row of clocks, or one per group)."""
    np.maximum.at(out, index if out.ndim == 1 else (Ellipsis, index), values)


def contended(pr, ready, engine, clock):
    """Transfers sharing ports, served in issue order, then each receiver's
    reductions: one batch per sender, in the order the batches' last transfers were served.
    Every array is indexed on its last axis: `ready` and `clock` may hold one row per group
    (hcomm.vgroups)."""
    od = _order_for(pr, ready)
    wire_end = np.zeros(ready.shape, dtype=_I64)
    held_end = np.zeros(ready.shape, dtype=_I64) if pr.outrun else wire_end    # when each transfer frees its ports
    for e, preds, pair in od.levels:
        start = ready[..., e]              # a copy (fancy indexing)
        for pe, has in preds:
            if len(pe):
                start[..., has] = np.maximum(start[..., has], held_end[..., pe])
        if pair is not None:
            pe, has = pair
            start[..., has] = np.maximum(start[..., has], wire_end[..., pe])
        wire_end[..., e] = start + pr.wire[e]
        if pr.outrun:
            held_end[..., e] = start + pr.occ[e]
    done = wire_end + pr.lat
    if od.unit is None:
        return done
    reducing, unit = od.unit
    u, cost = od.units
    last = np.full(ready.shape[:-1] + (u,), np.iinfo(_I64).min, dtype=_I64)
    maximum_at(last, unit, done[..., reducing])
    end = last.copy()
    if od.chains:
        eng = clock if engine is None else engine
        for units, before in od.chains:
            prev = eng[..., od.udst[units]] if before is None else end[..., before]
            end[..., units] = np.maximum(last[..., units], prev) + cost[units]
    done[..., reducing] = end[..., unit]
    return done
