"""A step's structure routed and priced once (hcomm.vtiming): the per-transfer arrays the
vectorised timing engine updates clocks with, and the caches that share them between steps.

A step is priced once per structure: steps with one timing key share a precomputation, steps of
one structure only re-price their bytes, and the steps of a ring phase (rotations of one chunk
pattern) rotate the pattern's prices.

A step's transfers of one sender to one receiver issued one after another are priced as one
(their wire times summed, one latency), and a run of equal ones is routed and priced once with its
multiplicity (hcomm.program.compact_timing): a step of millions of block transfers (NHR, NB on
thousands of servers) costs what its pairs cost.
"""
from __future__ import annotations

import numpy as np

from topologies.model import transfer_ns_array

from .program import GlobalStep, RolledView, compact_timing, counts, expand_timing

_I64 = np.int64
_CACHE_LIMIT = 20000


class Prep:
    """Per-step arrays that depend only on the step's structure and the topology."""
    __slots__ = ("src", "dst", "nf", "nb", "wire", "occ", "outrun", "_pbw", "lat", "red", "rflag", "eport", "iport", "l_rank", "l_cost", "fast",
                 "perm", "inv", "src_unique", "dst_unique", "cost_fwd", "n", "_struct", "_order", "listing", "_bw",
                 "shift", "nb_zero", "ports_free", "rollable", "key", "pieces")


def _distinct(values) -> bool:
    """No value repeats (non-negative integer ids)."""
    if len(values) < 2:
        return True
    if int(values.max()) > 8 * len(values) + 4096:
        # sparse ids (a synthetic full mesh numbers its ports up to 2 p^2): sort, not a p^2 table
        ordered = np.sort(values)
        return not bool((ordered[1:] == ordered[:-1]).any())
    return int(np.bincount(values).max()) <= 1


def _back_to_back(pr, inv, counts) -> bool:
    """Whether every pair's transfers, though other pairs' lie between them in issue order, are
    still served one after another: no transfer between a pair's first and last holds its egress
    or ingress port (ports serve in issue order), or goes to its receiver (whose reductions run in
    the order of their batches' last transfers). Then, as for a pair issued in one run, each of its
    transfers starts as the one before ends on the wire, and the pair prices as one (A3's double
    ring: both halves' runs to the same peer, one half's listed after the other's)."""
    places = np.arange(pr.n)
    for resource in (pr.eport, pr.iport, pr.dst):
        place = np.empty(pr.n, dtype=_I64)
        place[np.argsort(resource, kind="stable")] = places      # issue order within each resource
        lo = np.full(len(counts), pr.n, dtype=_I64)
        hi = np.zeros(len(counts), dtype=_I64)
        np.minimum.at(lo, inv, place)
        np.maximum.at(hi, inv, place)
        if (hi - lo + 1 != counts).any():
            return False
    return True


def _aggregate_pairs(pr) -> bool:
    """Price several transfers of one sender to one receiver as one.

    When they are issued one after another, they have the same ready time and issue-order
    neighbours, so they are served back to back on the same two ports: the last arrives after the sum of their wire times plus one latency, which
    is when the step's ends depend on; their reductions form one batch. Exact, and a step of a
    million block transfers (NB's ReduceScatter on hundreds of servers) becomes thousands.
    False when some pair's transfers cannot be priced as one (they are then kept apart)."""
    n = pr.n
    if n < 2:
        return True
    key = pr.src * (int(pr.dst.max()) + 1) + pr.dst
    if bool((key[1:] > key[:-1]).all()):
        return True                        # pairs listed in increasing order, each once: no unique() sort
    uniq, inv = np.unique(key, return_inverse=True)
    if len(uniq) == n:
        return True
    flags = np.zeros(len(uniq), dtype=_I64)
    np.add.at(flags, inv, pr.rflag.astype(_I64))
    counts = np.bincount(inv)
    if ((flags != 0) & (flags != counts)).any():
        return False                       # a pair mixing reducing and plain receives: keep them apart
    first = np.zeros(len(uniq), dtype=_I64)
    first[inv[::-1]] = np.arange(n)[::-1]
    last = np.zeros(len(uniq), dtype=_I64)
    last[inv] = np.arange(n)
    if (last - first + 1 != counts).any() and not _back_to_back(pr, inv, counts):
        return False                       # interleaved with other pairs on their ports: keep them apart
    wire = np.zeros(len(uniq), dtype=_I64)
    np.add.at(wire, inv, pr.wire)
    red = np.zeros(len(uniq), dtype=_I64)
    np.add.at(red, inv, pr.red)
    # the pair's ports are free once its last transfer has held them (its wire before that ran back to back)
    occ = wire - (pr.wire[last] - pr.occ[last]) if pr.outrun else wire
    for name in ("src", "dst", "nf", "nb", "lat", "eport", "iport", "rflag", "listing"):
        setattr(pr, name, getattr(pr, name)[first])
    pr.wire, pr.occ, pr.red, pr.n = wire, occ, red, len(uniq)
    return True


def _prep(view, cost, dtype, redop, p, compact=True) -> Prep:
    """Route and price a step's timing view.

    Runs of consecutive transfers of one pair, equal bytes and one kind are routed and priced
    once, with their multiplicity (hcomm.program.compact_timing): their sum of wire times and of
    reduction times is the multiplicity times one's, so the pair aggregation below gets exactly
    the sums it gets from the transfers one by one, and a step of millions of block transfers
    routes only its pairs. Where the pairs cannot be aggregated, the transfers are priced one by
    one from the expanded view, as before."""
    if compact:
        view = compact_timing(view)
    count = counts(view)
    pr = Prep()
    pr._struct = pr._order = pr._bw = pr.shift = pr.key = None
    pr.nb_zero = pr.ports_free = pr.rollable = pr.outrun = False
    pr.occ = pr._pbw = None
    src = np.asarray(view.t_src, dtype=_I64)
    dst = np.asarray(view.t_dst, dtype=_I64)
    pr.src, pr.dst, pr.n = src, dst, len(src)
    pr.pieces = len(src) if count is None else int(count.sum())      # transfers the view stands for
    pr.listing = np.arange(len(src), dtype=_I64)
    dm = cost.device_model
    if len(src):
        lat, bw, pbw, eport, iport = cost.route_arrays(src, dst)
        pr.rflag = np.asarray(view.t_rbuf) >= 0
        pr.outrun = bool((pbw != bw).any())       # some port carries more than its pair's rate
        bw = dm.wire_bandwidth(bw, pr.rflag, dtype, redop or "sum")
        pr._bw = bw
        pr.wire = transfer_ns_array(view.t_bytes, bw)
        pr._pbw = dm.wire_bandwidth(pbw, pr.rflag, dtype, redop or "sum") if pr.outrun else bw
        pr.occ = transfer_ns_array(view.t_bytes, pr._pbw) if pr.outrun else pr.wire
        pr.lat = lat
        pr.eport, pr.iport = eport, iport
        pr.nf = cost.notify_arrays(src, dst) + dm.dispatch_ns      # ready: notify and the step's dispatch
        pr.nb = cost.notify_arrays(dst, src)
        pr.red = np.where(pr.rflag, dm.reduce_ns_array(view.t_bytes, dtype, redop or "sum"), 0)
        if count is not None:
            # a run's transfers back to back: the sum of their wire times; its ports are free once
            # the last has held them
            one = pr.wire
            pr.wire = one * count
            pr.occ = pr.wire - (one - pr.occ) if pr.outrun else pr.wire
            pr.red = pr.red * count
        if not _aggregate_pairs(pr) and count is not None:
            return _prep(expand_timing(view), cost, dtype, redop, p, compact=False)
        src, dst, eport, iport = pr.src, pr.dst, pr.eport, pr.iport
        pr.cost_fwd = pr.nf + pr.wire + pr.lat + pr.red
    l_rank = np.concatenate([np.asarray(view.c_rank, dtype=_I64), np.asarray(view.g_rank, dtype=_I64)])
    c_cost = np.where(np.asarray(view.c_rbuf) >= 0, dm.local_reduce_ns_array(view.c_bytes, dtype, redop or "sum"),
                      dm.copy_ns_array(view.c_bytes))
    l_cost = np.concatenate([c_cost, dm.copy_ns_array(view.g_bytes)]) if len(l_rank) else l_rank
    keep = l_cost > 0
    pr.l_rank, pr.l_cost = l_rank[keep], l_cost[keep]
    if len(src):
        pr.src_unique = _distinct(src)
        pr.dst_unique = _distinct(dst)
        costly = pr.red > 0
        pr.ports_free = _distinct(eport) and _distinct(iport)
        pr.fast = not len(pr.l_rank) and pr.ports_free and (pr.dst_unique or _distinct(dst[costly]))
        pr.nb_zero = not pr.nb.any()
        # the byte-dependent costs are functions of the bytes alone: a rotated pattern's are rotated
        pr.rollable = (pr.n == pr.pieces and not len(pr.l_rank) and bool((pr._bw == pr._bw[0]).all())
                       and bool((pr._pbw == pr._pbw[0]).all()) and bool((pr.rflag == pr.rflag[0]).all()))
        # every rank sends once and receives once: the cheapest update
        pr.perm = pr.src_unique and pr.dst_unique and len(src) == p
        if pr.perm:
            pr.inv = np.empty(p, dtype=_I64)
            pr.inv[dst] = np.arange(p)
            ar = np.arange(p)
            if np.array_equal(src, ar) and np.array_equal(dst, (ar + int(dst[0])) % p):
                pr.shift = int(dst[0])         # rank r sends to r + shift: gathers become rotations
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
                 (np.asarray(st.c_rbuf) >= 0).tobytes(),
                 np.ascontiguousarray(st.g_rank).tobytes(), np.ascontiguousarray(st.g_bytes).tobytes()]
        key = st.cache["content_key"] = ("content", hash(tuple(parts)), len(st.t_src))
    return key


def _structure_key(st):
    """A key from an eager step's timing arrays without its byte counts (remembered on the step)."""
    key = st.cache.get("structure_key")
    if key is None:
        parts = [np.ascontiguousarray(st.t_src).tobytes(), np.ascontiguousarray(st.t_dst).tobytes(),
                 (np.asarray(st.t_rbuf) >= 0).tobytes()]
        key = st.cache["structure_key"] = ("eager", hash(tuple(parts)), len(st.t_src))
    return key


def _by_structure(st, cost, dtype, redop, p, cache):
    """An eager step's prep, re-priced from a step of the same structure where one was priced
    (an op's loops of two lengths differ in their bytes only), else made, and kept for the
    next one where it can be shared (as for steps with an `skey`)."""
    view = st.timing()
    if not isinstance(st, GlobalStep) or counts(view) is not None or len(st.c_rank) or len(st.g_rank):
        return _prep(view, cost, dtype, redop, p)
    return _shared_prep(view, ("structure", _structure_key(st), dtype, redop), cost, dtype, redop, p, cache)


def _shared_prep(view, ck, cost, dtype, redop, p, cache):
    """The prep of a step whose structure `ck` names: a step of that structure priced before,
    re-priced for these bytes (rotated, for a ring phase's RolledView), else made here and kept
    for the next one where it can be shared."""
    base = cache.get(ck)
    if base is not None and base.rollable and isinstance(view, RolledView):
        return _rolled(base, view, cost, dtype, redop, cache, ck)
    if base is not None:
        pr = _reprice(base, view, cost, dtype, redop)
        if pr is not None:
            return pr
    pr = _prep(view, cost, dtype, redop, p)
    if pr.n == pr.pieces and not len(pr.l_rank):   # no pair aggregation: safe to share
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[ck] = pr
        if pr.rollable and isinstance(view, RolledView):
            return _rolled(pr, view, cost, dtype, redop, cache, ck)
    return pr


def step_key(st):
    if st.tkey is not None:
        return st.tkey
    if isinstance(st, GlobalStep):
        return _content_key(st)
    return None


def _reprice(base, view, cost, dtype, redop):
    """A step's prep from a cached one of the same structure: only the byte-dependent costs change."""
    pr = Prep()
    for name in Prep.__slots__:
        setattr(pr, name, getattr(base, name, None))
    dm = cost.device_model
    nbytes = np.asarray(view.t_bytes, dtype=_I64)
    pr.wire = transfer_ns_array(nbytes, base._bw)
    pr.occ = transfer_ns_array(nbytes, base._pbw) if base.outrun else pr.wire
    pr.red = np.where(pr.rflag, dm.reduce_ns_array(nbytes, dtype, redop or "sum"), 0)
    pr.cost_fwd = pr.nf + pr.wire + pr.lat + pr.red
    if len(pr.l_rank) or len(np.asarray(view.c_rank)) or len(np.asarray(view.g_rank)):
        return None                          # local ops' costs depend on bytes too: price afresh
    costly = pr.red > 0
    pr.fast = pr.ports_free and (pr.dst_unique or _distinct(pr.dst[costly]))
    pr._order = None                          # costly receives depend on bytes: order afresh if contended
    pr.key = None
    return pr


def _rolled(base, view, cost, dtype, redop, cache, ck):
    """A rotated step's prep from its structure's: the pattern's prices, computed once and kept
    twice over so that every rotation is a slice. Steps whose pattern prices alike (a ring over
    chunks of 9,832 and 9,836 bytes both taking 394 ns) get a common key: they are one map, so
    runs of them are finished by the uniform-shift rule like the steps of an even ring."""
    pattern = view.pattern
    pk = ("pattern", ck, id(pattern))
    got = cache.get(pk)
    if got is None or got[0] is not pattern:
        dm = cost.device_model
        nbytes = np.asarray(pattern, dtype=_I64)
        wire = transfer_ns_array(nbytes, base._bw[:1])
        occ = transfer_ns_array(nbytes, base._pbw[:1]) if base.outrun else wire
        red = np.where(base.rflag[0], dm.reduce_ns_array(nbytes, dtype, redop or "sum"), 0).astype(_I64)
        alike = bool(wire.min() == wire.max() and occ.min() == occ.max() and red.min() == red.max())
        key = ("priced", ck, int(wire[0]), int(occ[0]), int(red[0])) if alike else None
        got = cache[pk] = (pattern, np.concatenate([wire, wire]), np.concatenate([red, red]), key,
                           np.concatenate([occ, occ]))
    n = len(pattern)
    k = view.shift % n
    pr = Prep()
    for name in Prep.__slots__:
        setattr(pr, name, getattr(base, name, None))
    pr.wire, pr.red = got[1][n - k:2 * n - k], got[2][n - k:2 * n - k]     # np.roll(prices, shift)
    pr.occ = got[4][n - k:2 * n - k] if base.outrun else pr.wire
    pr.cost_fwd = pr.nf + pr.wire + pr.lat + pr.red
    pr.fast = pr.ports_free and (pr.dst_unique or _distinct(pr.dst[pr.red > 0]))
    pr._order = None
    pr.key = got[3]
    return pr


def prep_for(st, cost, dtype, redop, p, cache):
    key = step_key(st)
    skey = st.skey
    if key is None and skey is not None:
        return _shared_prep(st.timing(), ("structure", skey, dtype, redop), cost, dtype, redop, p, cache)
    if key is not None:
        ck = (key, dtype, redop)
        pr = cache.get(ck)
        if pr is None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            pr = cache[ck] = _by_structure(st, cost, dtype, redop, p, cache)
        return pr
    local = st.cache.get((cost.key, dtype, redop))
    if local is None:
        local = _prep(st.timing(), cost, dtype, redop, p)
        if isinstance(st, GlobalStep):   # eager steps keep their prep; lazy ones are rebuilt each time
            st.cache[(cost.key, dtype, redop)] = local
    return local
