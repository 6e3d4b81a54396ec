"""The timing model, vectorised over ranks: a program's simulated times without payload.

Same rules as the event-driven reference (hcomm.timing.replay), applied a global step at a
time. Two facts make that exact:
- Ports and device engines belong to one NPU, and a rank starts step t+1 only after all of its
  step-t transfers have completed, so no port or engine is ever still busy from an earlier step
  when a later one begins: contention happens only among the transfers of one step.
- Both ends of every transfer are in the same global step (programs are aligned), so a step's
  transfers are ready at max(sender clock, receiver clock) + notify.
Within a step, transfers sharing a port (or a receiver's reduce engine) are served in
(ready, sender, receiver, listing) order, as the reference serves them. A step where no two
transfers share a port or an engine, which is most steps of most algorithms, costs a handful of
array operations; otherwise the step's transfers are levelled along their resource chains and
each level is one vectorised update.
"""
from __future__ import annotations

import numpy as np

from .cost import as_cost
from .program import Step

_I64 = np.int64
_CACHE_LIMIT = 20000


class _Prep:
    """Per-step arrays that depend only on the step's structure and the topology."""
    __slots__ = ("src", "dst", "nf", "nb", "wire", "lat", "red", "rflag", "eport", "iport", "l_rank", "l_cost", "fast",
                 "perm", "inv", "src_unique", "dst_unique", "cost_fwd", "n", "_struct", "_order", "listing", "_bw")


def _distinct(values) -> bool:
    """No value repeats (non-negative integer ids)."""
    if len(values) < 2:
        return True
    if int(values.max()) > 8 * len(values) + 4096:
        # sparse ids (a synthetic full mesh numbers its ports up to 2 p^2): sort, not a p^2 table
        ordered = np.sort(values)
        return not bool((ordered[1:] == ordered[:-1]).any())
    return int(np.bincount(values).max()) <= 1


def _aggregate_pairs(pr) -> None:
    """Price several transfers of one sender to one receiver as one.

    When they are issued one after another, they have the same ready time and issue-order
    neighbours, so they are served back to back on the same two ports: the last arrives after the sum of their wire times plus one latency, which
    is when the step's ends depend on; their reductions form one batch. Exact, and a step of a
    million block transfers (NB's ReduceScatter on hundreds of servers) becomes thousands."""
    n = pr.n
    if n < 2:
        return
    key = pr.src * (int(pr.dst.max()) + 1) + pr.dst
    uniq, inv = np.unique(key, return_inverse=True)
    if len(uniq) == n:
        return
    flags = np.zeros(len(uniq), dtype=_I64)
    np.add.at(flags, inv, pr.rflag.astype(_I64))
    counts = np.bincount(inv)
    if ((flags != 0) & (flags != counts)).any():
        return                             # a pair mixing reducing and plain receives: keep them apart
    first = np.zeros(len(uniq), dtype=_I64)
    first[inv[::-1]] = np.arange(n)[::-1]
    last = np.zeros(len(uniq), dtype=_I64)
    last[inv] = np.arange(n)
    if (last - first + 1 != counts).any():
        return                             # interleaved with other pairs in issue order: keep them apart
    wire = np.zeros(len(uniq), dtype=_I64)
    np.add.at(wire, inv, pr.wire)
    red = np.zeros(len(uniq), dtype=_I64)
    np.add.at(red, inv, pr.red)
    for name in ("src", "dst", "nf", "nb", "lat", "eport", "iport", "rflag", "listing"):
        setattr(pr, name, getattr(pr, name)[first])
    pr.wire, pr.red, pr.n = wire, red, len(uniq)


def _prep(view, cost, dtype, redop, p) -> _Prep:
    pr = _Prep()
    pr._struct = pr._order = pr._bw = None
    src = np.asarray(view.t_src, dtype=_I64)
    dst = np.asarray(view.t_dst, dtype=_I64)
    pr.src, pr.dst, pr.n = src, dst, len(src)
    pr.listing = np.arange(len(src), dtype=_I64)
    dm = cost.device_model
    if len(src):
        lat, bw, eport, iport = cost.route_arrays(src, dst)
        from topologies.model import transfer_ns_array
        pr.rflag = np.asarray(view.t_rbuf) >= 0
        bw = dm.wire_bandwidth(bw, pr.rflag, dtype, redop or "sum")
        pr._bw = bw
        pr.wire = transfer_ns_array(view.t_bytes, bw)
        pr.lat = lat
        pr.eport, pr.iport = eport, iport
        pr.nf = cost.notify_arrays(src, dst)
        pr.nb = cost.notify_arrays(dst, src)
        pr.red = np.where(pr.rflag, dm.reduce_ns_array(view.t_bytes, dtype, redop or "sum"), 0)
        _aggregate_pairs(pr)
        src, dst, eport, iport = pr.src, pr.dst, pr.eport, pr.iport
        pr.cost_fwd = pr.nf + pr.wire + pr.lat + pr.red
    l_rank = np.concatenate([np.asarray(view.c_rank, dtype=_I64), np.asarray(view.g_rank, dtype=_I64)])
    l_cost = np.concatenate([dm.copy_ns_array(view.c_bytes), dm.copy_ns_array(view.g_bytes)]) if len(l_rank) else l_rank
    keep = l_cost > 0
    pr.l_rank, pr.l_cost = l_rank[keep], l_cost[keep]
    if len(src):
        pr.src_unique = _distinct(src)
        pr.dst_unique = _distinct(dst)
        costly = pr.red > 0
        pr.fast = (not len(pr.l_rank) and _distinct(eport) and _distinct(iport) and _distinct(dst[costly]))
        # every rank sends once and receives once: the cheapest update
        pr.perm = pr.src_unique and pr.dst_unique and len(src) == p
        if pr.perm:
            pr.inv = np.empty(p, dtype=_I64)
            pr.inv[dst] = np.arange(p)
    else:
        pr.fast = not len(pr.l_rank)
        pr.perm = False
    return pr


def _content_key(st):
    """A key from an eager step's timing arrays (computed once and remembered on the step)."""
    key = st.cache.get("content_key")
    if key is None:
        parts = [np.ascontiguousarray(st.t_src).tobytes(), np.ascontiguousarray(st.t_dst).tobytes(),
                 np.ascontiguousarray(st.t_bytes).tobytes(), (np.asarray(st.t_rbuf) >= 0).tobytes(),
                 np.ascontiguousarray(st.c_rank).tobytes(), np.ascontiguousarray(st.c_bytes).tobytes(),
                 np.ascontiguousarray(st.g_rank).tobytes(), np.ascontiguousarray(st.g_bytes).tobytes()]
        key = st.cache["content_key"] = ("content", hash(tuple(parts)), len(st.t_src))
    return key


def step_key(st):
    if st.tkey is not None:
        return st.tkey
    if isinstance(st, Step):
        return _content_key(st)
    return None


def _reprice(base, view, cost, dtype, redop):
    """A step's prep from a cached one of the same structure: only the byte-dependent costs change."""
    pr = _Prep()
    for name in _Prep.__slots__:
        setattr(pr, name, getattr(base, name, None))
    dm = cost.device_model
    from topologies.model import transfer_ns_array
    nbytes = np.asarray(view.t_bytes, dtype=_I64)
    pr.wire = transfer_ns_array(nbytes, base._bw)
    pr.red = np.where(pr.rflag, dm.reduce_ns_array(nbytes, dtype, redop or "sum"), 0)
    pr.cost_fwd = pr.nf + pr.wire + pr.lat + pr.red
    if len(pr.l_rank) or len(np.asarray(view.c_rank)) or len(np.asarray(view.g_rank)):
        return None                          # local ops' costs depend on bytes too: price afresh
    costly = pr.red > 0
    pr.fast = _distinct(pr.eport) and _distinct(pr.iport) and _distinct(pr.dst[costly])
    pr._order = None                          # costly receives depend on bytes: order afresh if contended
    return pr


def _prep_for(st, cost, dtype, redop, p, cache):
    key = step_key(st)
    skey = getattr(st, "skey", None)
    if key is None and skey is not None:
        ck = ("structure", skey, dtype, redop)
        base = cache.get(ck)
        view = st.timing()
        if base is not None:
            pr = _reprice(base, view, cost, dtype, redop)
            if pr is not None:
                return pr
        pr = _prep(view, cost, dtype, redop, p)
        if pr.n == len(view.t_src) and not len(pr.l_rank):   # no pair aggregation: safe to share
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[ck] = pr
        return pr
    if key is not None:
        ck = (key, dtype, redop)
        pr = cache.get(ck)
        if pr is None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            pr = cache[ck] = _prep(st.timing(), cost, dtype, redop, p)
        return pr
    local = st.cache.get((cost.key, dtype, redop)) if hasattr(st, "cache") else None
    if local is None:
        local = _prep(st.timing(), cost, dtype, redop, p)
        if isinstance(st, Step):   # eager steps keep their prep; lazy ones are rebuilt each time
            st.cache[(cost.key, dtype, redop)] = local
    return local


def _step(pr: _Prep, clock):
    if pr.n == 0 and not len(pr.l_rank):
        return clock
    if pr.fast and pr.perm and pr.src is not None:
        done = np.maximum(clock[pr.src], clock[pr.dst])
        done += pr.cost_fwd
        new = done[pr.inv]                 # receive completion, by receiver
        ack = done + pr.nb                 # send completion, by sender
        if pr.src_unique:
            sent = np.empty_like(new)
            sent[pr.src] = ack
            np.maximum(new, sent, out=new)
        return new
    new = clock.copy()
    engine = None
    if len(pr.l_rank):
        # local copies and staging run first, serially on each rank's engine
        busy = np.bincount(pr.l_rank, weights=pr.l_cost, minlength=len(clock)).astype(_I64)
        engine = clock + busy
        np.maximum(new, engine, out=new)
    if pr.n == 0:
        return new
    ready = np.maximum(clock[pr.src], clock[pr.dst]) + pr.nf
    if pr.fast:
        done = ready + pr.wire + pr.lat + pr.red
    else:
        done = _contended(pr, ready, engine, clock)
    if pr.dst_unique:
        new[pr.dst] = np.maximum(new[pr.dst], done)
    else:
        np.maximum.at(new, pr.dst, done)
    ack = done + pr.nb
    if pr.src_unique:
        new[pr.src] = np.maximum(new[pr.src], ack)
    else:
        np.maximum.at(new, pr.src, ack)
    return new


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


class _Order:
    """The service order of a contended step and everything derived from it."""
    __slots__ = ("order", "pos", "p_out", "p_in", "levels", "unit", "units", "udst", "chains")


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
    level = np.zeros(n, dtype=_I64)
    while True:
        cand = level.copy()
        for pred in (od.p_out, od.p_in):
            has = pred >= 0
            cand[has] = np.maximum(cand[has], level[pred[has]] + 1)
        if np.array_equal(cand, level):
            break
        level = cand
    od.levels = []
    for lv in range(int(level.max()) + 1):
        e = np.flatnonzero(level == lv)
        preds = [(pred[e], pred[e] >= 0) for pred in (od.p_out, od.p_in)]
        od.levels.append((e, [(pe[has], has) for pe, has in preds]))
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


def _contended(pr, ready, engine, clock):
    """Transfers sharing ports, served in issue order, then each receiver's
    reductions: one batch per sender, in the order the batches' last transfers were served."""
    od = _order_for(pr, ready)
    wire_end = np.zeros(pr.n, dtype=_I64)
    for e, preds in od.levels:
        start = ready[e]                   # a copy (fancy indexing)
        for pe, has in preds:
            if len(pe):
                start[has] = np.maximum(start[has], wire_end[pe])
        wire_end[e] = start + pr.wire[e]
    done = wire_end + pr.lat
    if od.unit is None:
        return done
    reducing, unit = od.unit
    u, cost = od.units
    last = np.full(u, np.iinfo(_I64).min, dtype=_I64)
    np.maximum.at(last, unit, done[reducing])
    end = last.copy()
    if od.chains:
        eng = clock if engine is None else engine
        for units, before in od.chains:
            prev = eng[od.udst[units]] if before is None else end[before]
            end[units] = np.maximum(last[units], prev) + cost[units]
    done[reducing] = end[unit]
    return done


def program_times(program, entry, cost, dtype="float32", redop="sum"):
    """Every rank's exit clock (ns, int64 array) for a program entered at `entry` clocks, priced
    by `cost` (an hcomm.cost.CostModel; a Topology is taken as its cost model).

    Timing is shift-invariant (every operation is a max or an addition of constants), so when a
    step of a run of identical steps moves every rank's clock by the same amount, each remaining
    step of the run does exactly that too, and the run is finished in one addition."""
    clock = np.asarray(entry, dtype=_I64).copy()
    p = len(clock)
    cost = as_cost(cost)
    cache = cost.cache("vtiming")
    n = len(program)
    t = 0
    while t < n:
        st = program[t]
        pr = _prep_for(st, cost, dtype, redop, p, cache)
        key = step_key(st)
        run = 1
        if key is not None:
            while t + run < n and step_key(program[t + run]) == key:
                run += 1
        done = 0
        while done < run:
            new = _step(pr, clock)
            done += 1
            if run - done >= 2 and (done == 1 or done % 4 == 0):
                delta = new - clock
                if delta.size and delta.min() == delta.max():
                    clock = new + delta[0] * (run - done)
                    done = run
                    break
            clock = new
        t += run
    return clock
