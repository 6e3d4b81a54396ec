"""NHR, Nonuniform Hierarchical Ring (HCCL NHR.md; templates reduce_scatter_nhr.cc,
all_gather_nhr.cc, all_reduce_nhr.cc, broadcast_nhr.cc, *_nhr_oneshot.cc, nhr_base.cc).

ceil(log2 p) steps for any p, with no extra volume when p is not a power of two:
- ReduceScatter, step s (s = 0, 1, ...): send to r - 2^s the partial sums of the
  floor((p-1+2^s)/2^(s+1)) blocks u = (r - 2^s) - k 2^(s+1); receive the same set from r + 2^s and
  reduce it in. Volume halves each step, distance doubles: the largest exchanges are between
  neighbours. Cost ceil(log2 p) a + (p-1)/p n(b+g).
- AllGather mirrors it: distance 2^(L-1-s) decreasing, volume increasing.
  Cost ceil(log2 p) a + (p-1)/p nb.
- AllReduce = ReduceScatter + AllGather through HCCL's slice map (a bit-reversal-like
  permutation that makes each step's blocks contiguous, so a step is one transfer per peer):
  2 ceil(log2 p) a + 2(p-1)/p nb + (p-1)/p ng. For small data (<= 256 KiB per rank, HCCL's
  NHR_ALLREDUCE_SMALL_SIZE) HCCL uses a one-shot tree instead: a binomial reduce to rank 0 and a
  tree broadcast, the whole buffer per step: 2 ceil(log2 p)(a + nb) + ceil(log2 p) ng.
- Broadcast = NHR Scatter + NHR AllGather (through the slice map), or for <= 2 MiB
  (NHR_BCAST_SMALL_SIZE) the one-shot tree broadcast: ceil(log2 p)(a + nb).
As in HCCL, the scatter may forward a block its sender has not received yet when p is not a
power of two; the AllGather overwrites it, and the bytes are counted.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from hcomm.program import LazyStep, TimingView

from .common import (INPUT, OUTPUT, SCRATCH, StepBuilder, bounds, ceil_log2, compacted, held_rounds, local_copy, merge_runs,
                     single_rank_reducescatter)

NAME = "NHR"
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "scatter")
LEVELS = ("flat", "level1")
DESCRIPTION = "nonuniform hierarchical ring: ceil(log2 p) steps for any p"
ALLREDUCE_SMALL_BYTES = 256 * 1024
BROADCAST_SMALL_BYTES = 2 * 1024 * 1024


@lru_cache(maxsize=256)
def slice_map(n: int) -> tuple:
    """HCCL's NHR slice permutation (GetRankMapping): rank x holds block map[x] after ReduceScatter.

    Each round cuts the tree into segments of `length` and moves a segment's even positions to
    its first half, its odd ones after them, until a segment has an odd length; a round is one
    array operation (131,072 level1 peers: 50 ms, not a second of Python)."""
    tree = np.arange(n, dtype=np.int64)
    position = np.arange(n, dtype=np.int64)
    length = n
    for s in range(ceil_log2(n)):
        if (n - 1 + (1 << s)) // (1 << (s + 1)) <= 1:
            break
        offset = position % length
        moved = np.zeros(n, dtype=np.int64)
        moved[position - offset + np.where(offset % 2 == 0, offset // 2, (offset + length) // 2)] = tree
        tree = moved
        odd = bool((np.minimum(length, n - np.arange(0, n, length)) % 2 == 1).any())
        length >>= 1
        if odd:
            break
    mapping = np.empty(n, dtype=np.int64)
    mapping[tree] = np.arange(n)
    return tuple(mapping.tolist())


def row_chunks(n: int, cnt: int, budget: int = 1 << 21):
    """Slices of the n senders such that a chunk's (senders x blocks) matrices stay small."""
    rows = max(1, budget // max(cnt, 1))
    return [slice(i, min(i + rows, n)) for i in range(0, n, rows)]


def received_before(delta, step: int, n: int):
    """Whether a rank already holds a partial of a block at relative distance `delta` before
    `step` (it received that block at step s' < step: delta = k 2^(s'+1) with k < count(s'))."""
    got = np.zeros(np.shape(delta), dtype=bool)
    for s in range(step):
        span = 1 << (s + 1)
        got |= (delta % span == 0) & (delta // span < (n - 1 + (1 << s)) // span)
    return got


def _add(b, src, dst, unit, sbuf, offs, blocks, dbuf, dlo, rbuf):
    """Transfers of whole rank blocks (one row of `blocks` per sender), merged where they continue
    each other. With HCCL's slice map every row is one contiguous run, found without sorting."""
    blocks = np.asarray(blocks)
    if blocks.ndim == 2 and blocks.shape[1] > 1:
        shape = blocks.shape
        sb, db, rb, dl = (np.broadcast_to(np.asarray(a), shape) for a in (sbuf, dbuf, rbuf, dlo))
        bmin, bmax = blocks.min(axis=1), blocks.max(axis=1)
        uniform = ((bmax - bmin + 1 == shape[1]) & (sb == sb[:, :1]).all(axis=1) & (db == db[:, :1]).all(axis=1)
                   & (rb == rb[:, :1]).all(axis=1) & (dl == offs[blocks]).all(axis=1))
        if uniform.all():
            src = np.asarray(src).reshape(shape)[:, 0]
            dst = np.asarray(dst).reshape(shape)[:, 0]
            lo, hi = offs[bmin], offs[bmax + 1]
            rbuf0 = rb[:, 0]
            b.transfers(src, dst, unit, sb[:, 0], lo, hi, db[:, 0], lo, rbuf=rbuf0, rlo=np.where(rbuf0 >= 0, lo, 0))
            return
    shape = np.shape(blocks)
    src, dst, blocks = (np.asarray(a).reshape(-1) for a in (src, dst, blocks))
    sbuf, dbuf, rbuf, dlo = (np.broadcast_to(np.asarray(a), shape).reshape(-1) for a in (sbuf, dbuf, rbuf, dlo))
    slo, shi = offs[blocks], offs[blocks + 1]
    keep = shi > slo
    if not keep.all() and keep.any():
        src, dst, sbuf, slo, shi, dbuf, dlo, rbuf = (a[keep] for a in (src, dst, sbuf, slo, shi, dbuf, dlo, rbuf))
    rlo = np.where(rbuf >= 0, slo, 0)          # a reduction's own operand sits at the block's rows
    src, dst, sbuf, slo, shi, dbuf, dlo, rbuf, rlo = merge_runs(src, dst, sbuf, slo, shi, dbuf, dlo, rbuf, rlo)
    b.transfers(src, dst, unit, sbuf, slo, shi, dbuf, dlo, rbuf=rbuf, rlo=rlo)


def window_extremes(values, start, stride: int, count: int):
    """(min, max) of values[(x + stride k) % n] over k < count, for every x in `start`.

    By doubling, O(n log count), instead of materialising every window, O(n count): on 16,384
    level1 peers that is the difference between milliseconds and a minute."""
    n = len(values)
    idx = np.arange(n)
    lo, hi = values.copy(), values.copy()        # over windows of `width` terms starting at each x
    width = 1
    while 2 * width <= count:
        nxt = (idx + stride * width) % n
        lo, hi = np.minimum(lo, lo[nxt]), np.maximum(hi, hi[nxt])
        width *= 2
    if width < count:                            # two overlapping windows of `width` cover `count`
        nxt = (idx + stride * (count - width)) % n
        lo, hi = np.minimum(lo, lo[nxt]), np.maximum(hi, hi[nxt])
    return lo[start], hi[start]


def _runs(smap, start, stride: int, cnt: int):
    """(first, last) block of every row smap[(start + stride k) % n], k < cnt, when every row is one
    contiguous run of blocks (what HCCL's slice map achieves), else None: exactly the rows `_add`
    turns into one transfer each, found without building the (rows x cnt) block matrix."""
    if cnt < 2:
        return None
    bmin, bmax = window_extremes(smap, start, stride, cnt)
    return (bmin, bmax) if (bmax - bmin + 1 == cnt).all() else None


def _run_transfers(b, src, dst, unit, sbuf, offs, runs, dbuf, rbuf):
    """One transfer per rank of its run of blocks, as `_add` writes a uniform row."""
    n = len(src)
    lo, hi = offs[runs[0]], offs[runs[1] + 1]
    rb = np.full(n, rbuf, dtype=np.int64)
    b.transfers(src, dst, unit, np.full(n, sbuf, dtype=np.int64), lo, hi, np.full(n, dbuf, dtype=np.int64), lo,
                rbuf=rb, rlo=np.where(rb >= 0, lo, 0))


def reducescatter(n: int, offs, unit: int, src=INPUT, acc=SCRATCH, out=OUTPUT, out_lo=None, smap=None) -> list:
    """Rank x ends with block smap[x] (default x) reduced, at out[out_lo[x]]; partials in acc."""
    return halving_reducescatter(n, offs, unit, src, acc, out, out_lo, smap, direction=-1)


def halving_reducescatter(n, offs, unit, src, acc, out, out_lo, smap, direction) -> list:
    """The ReduceScatter NHR (direction -1) and NB (+1) share: in step s rank r sends to r + d 2^s the
    partials of blocks u = (r + d 2^s) + d k 2^(s+1), k < floor((n-1+2^s)/2^(s+1))."""
    offs = np.asarray(offs, dtype=np.int64)
    ident = smap is None or np.array_equal(smap, np.arange(n))
    smap = np.arange(n) if smap is None else np.asarray(smap, dtype=np.int64)
    out_lo = np.zeros(n, dtype=np.int64) if out_lo is None else np.asarray(out_lo, dtype=np.int64)
    if n == 1:
        return single_rank_reducescatter(offs, unit, src, out, out_lo, int(smap[0]))
    r = np.arange(n)
    L = ceil_log2(n)
    sizes = _block_sizes(offs, n) if ident else None
    steps = []
    for s in range(L):
        P = 1 << s
        cnt = (n - 1 + P) // (2 * P)
        last = s == L - 1
        to_all = (r + direction * P) % n
        k = np.arange(cnt)
        # Which buffer holds block k's partial depends on k alone: the block lies P + 2Pk (mod n)
        # from its sender and 2Pk from its receiver, for every rank.
        sbuf = np.where(received_before((P + 2 * P * k) % n, s, n), acc, src)
        rbuf = np.where(received_before((2 * P * k) % n, s, n), acc, src)
        runs = None
        if not last and (sbuf == sbuf[0]).all() and (rbuf == rbuf[0]).all():
            runs = _runs(smap, to_all, direction * 2 * P, cnt)

        def build(P=P, cnt=cnt, last=last, to_all=to_all, k=k, sbuf=sbuf, rbuf=rbuf, runs=runs):
            b = StepBuilder()
            if runs is not None:
                _run_transfers(b, r, to_all, unit, sbuf[0], offs, runs, acc, rbuf[0])
                return b.build()
            for rows in row_chunks(n, cnt):       # bounded memory on thousands of servers
                rr, to = r[rows], to_all[rows]
                blocks = smap[(to[:, None] + direction * 2 * P * k[None, :]) % n]
                _add(b, np.repeat(rr, cnt), np.repeat(to, cnt), unit, sbuf[None, :], offs, blocks,
                     out if last else acc, out_lo[to][:, None] if last else offs[blocks], rbuf[None, :])
            return b.build()
        per_peer = (runs is None and cnt > 1 and sizes is not None and n * cnt > LAZY_PIECES
                    and len(np.unique(rbuf >= 0)) == 1)
        steps.append(_block_step(build, per_peer, r, to_all, to_all, direction * 2 * P, cnt, sizes, unit, int(rbuf[0])))
    return steps


def _block_sizes(offs, n, most: int = 8):
    """(distinct sizes, each block's index among them) when the n blocks are not empty and of
    at most `most` sizes, else None."""
    sizes = np.diff(offs[:n + 1])
    if len(sizes) != n or not bool((sizes > 0).all()):
        return None
    values, which = np.unique(sizes, return_inverse=True)
    return (values, which.reshape(-1)) if len(values) <= most else None


def window_counts(which, kinds: int, start, stride: int, count: int):
    """(len(start), kinds) counts of each kind among which[(x + stride k) % n], k < count, for every
    x in start: by doubling, O(kinds n log count), not the (n x count) window matrix."""
    n = len(which)
    block = np.zeros((n, kinds), dtype=np.int64)        # kinds over windows of `width` from each x
    block[np.arange(n), which] = 1
    out = np.zeros((len(start), kinds), dtype=np.int64)
    pos = np.asarray(start, dtype=np.int64) % n
    width, c = 1, count
    while c:
        if c & 1:
            out += block[pos]
            pos = (pos + stride * width) % n
        c >>= 1
        if c:
            block = block + block[(np.arange(n) + stride * width) % n]
            width *= 2
    return out


LAZY_PIECES = 1 << 16     # block transfers in a step above which its data program is built on demand


def _block_step(build, per_peer: bool, src, dst, start, stride: int, cnt: int, sizes, unit: int, rbuf: int):
    """A step of cnt > 1 blocks per peer, its data program made by `build`; rank src[i] sends
    blocks (start[i] + stride k) % n, k < cnt, to dst[i].

    With HCCL's rank order (no slice map) and non-empty blocks, the view is known without
    building the step: a rank's cnt blocks lie |stride| (mod n) apart, and two of them would be
    adjacent only if |stride| j = +-1 (mod n) for some 0 < j < cnt, which 0 < |stride| j <= n - 1
    - |stride| / 2 rules out; so `_add` keeps them as cnt transfers, listed peer by peer in block
    order. With equal blocks the view is one entry of multiplicity cnt per peer: what
    hcomm.program.compact_timing makes of the built step (tests check it). With a few sizes it
    is one entry per peer and size (a grouped view, hcomm.program.TimingView.expand), which the
    timing model prices as the built step's transfers. The data program (millions of transfers
    on thousands of servers) is only built when an engine moves data, or the timing model needs
    a grouped pair's order. `per_peer` says the caller checked those conditions; otherwise the
    step is built now and its view compacted from it."""
    if not per_peer:
        return compacted(build())
    n = len(src)
    values, which = sizes
    if len(values) == 1:
        view = TimingView(src, dst, np.full(n, int(values[0]) * unit, dtype=np.int64), np.full(n, rbuf, dtype=np.int64),
                          t_count=np.full(n, cnt, dtype=np.int64))
    else:
        per = window_counts(which, len(values), start, stride, cnt)   # (peers, sizes)
        peer, kind = np.nonzero(per)                                 # peer by peer, sizes ascending
        view = TimingView(src[peer], dst[peer], values[kind] * unit, np.full(len(peer), rbuf, dtype=np.int64),
                          t_count=per[peer, kind], expand=build)
    return LazyStep(build, lambda: view)


def allgather(n: int, offs, unit: int, buf=OUTPUT, smap=None) -> list:
    """In place: rank x's block smap[x] (default x) is already in buf."""
    offs = np.asarray(offs, dtype=np.int64)
    ident = smap is None or np.array_equal(smap, np.arange(n))
    smap = np.arange(n) if smap is None else np.asarray(smap, dtype=np.int64)
    r = np.arange(n)
    L = ceil_log2(n)
    sizes = _block_sizes(offs, n) if ident else None
    steps = []
    for s in range(L):
        d = 1 << (L - 1 - s)
        cnt = (n - 1 + d) // (2 * d)
        runs = _runs(smap, r, -2 * d, cnt)

        def build(d=d, cnt=cnt, runs=runs):
            b = StepBuilder()
            if runs is not None:
                _run_transfers(b, r, (r + d) % n, unit, buf, offs, runs, buf, -1)
                return b.build()
            for rows in row_chunks(n, cnt):
                rr = r[rows]
                blocks = smap[(rr[:, None] - 2 * d * np.arange(cnt)[None, :]) % n]
                _add(b, np.repeat(rr, cnt), np.repeat((rr + d) % n, cnt), unit, buf, offs, blocks, buf, offs[blocks],
                     -1)
            return b.build()
        steps.append(_block_step(build, runs is None and cnt > 1 and sizes is not None and n * cnt > LAZY_PIECES,
                                 r, (r + d) % n, r, -2 * d, cnt, sizes, unit, -1))
    return steps


def _tree_reduce(n, N, unit, root, src, dst):
    """One-shot: distances increasing, the whole buffer per step, into the root."""
    has = np.zeros(n, dtype=bool)
    steps = []
    for s in range(ceil_log2(n)):
        P, G = 1 << s, 2 << s
        n_r = (n - 1 + P) // G
        d = np.arange(n)
        senders = d[(d // G < n_r) & (d % G == P)]
        rel_recv = senders - P
        steps.append(StepBuilder().transfers((senders + root) % n, (rel_recv + root) % n, unit,
                                             np.where(has[senders], dst, src), 0, N, dst, 0,
                                             rbuf=np.where(has[rel_recv], dst, src), rlo=0).build())
        has[rel_recv] = True
    return steps


def _tree_broadcast(n, N, unit, root, buf):
    """One-shot: distances decreasing, the whole buffer per step, from the root (data already in buf)."""
    L = ceil_log2(n)
    steps = []
    for s in range(L):
        P, G = 1 << (L - 1 - s), 2 << (L - 1 - s)
        n_r = (n - 1 + P) // G
        d = np.arange(n)
        senders = d[(d // G < n_r) & (d % G == 0)]
        steps.append(StepBuilder().transfers((senders + root) % n, (senders + P + root) % n, unit, buf, 0, N,
                                             buf, 0).build())
    return steps


def allreduce(n: int, N: int, unit: int, src=INPUT, dst=OUTPUT, oneshot: bool | None = None) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    if oneshot is None:
        oneshot = N * unit <= ALLREDUCE_SMALL_BYTES
    if oneshot:
        steps = _tree_reduce(n, N, unit, 0, src, dst)
        return steps + _tree_broadcast(n, N, unit, 0, dst)
    smap = np.asarray(slice_map(n))
    offs = bounds(N, n)
    return (reducescatter(n, offs, unit, src, dst, dst, offs[smap], smap)
            + allgather(n, offs, unit, dst, smap))


def broadcast(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT, oneshot: bool | None = None) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    if oneshot is None:
        oneshot = N * unit <= BROADCAST_SMALL_BYTES
    steps = []
    if src != dst:
        steps = [StepBuilder().copies([root], unit, src, 0, N, dst, 0).build()]
    if oneshot:
        return steps + _tree_broadcast(n, N, unit, root, dst)
    smap = np.asarray(slice_map(n))
    offs = bounds(N, n)
    r = np.arange(n)
    L = ceil_log2(n)
    pow2 = n & (n - 1) == 0
    for s in range(L):
        P = 1 << s
        cnt = (n - 1 + P) // (2 * P)
        d_root = (root - r) % n
        n_r = n - P if (not pow2 and s == L - 1) else P
        senders = r[d_root < n_r]
        u = ((senders - P)[:, None] - 2 * P * np.arange(cnt)[None, :]) % n
        b = StepBuilder()
        blocks = smap[u]
        _add(b, np.repeat(senders, cnt), np.repeat((senders - P) % n, cnt), unit, dst, offs, blocks, dst,
             offs[blocks], -1)
        steps.append(b.build())
    return steps + allgather(n, offs, unit, dst, smap)


def scatter_rounds(n: int, root: int) -> list:
    """Scatter (HCCL scatter_nhr.cc GetStepInfo): ceil(log2 n) steps; in step s the ranks within
    2^s below the root (n - 2^s in a last step of a non-power-of-two n) each send to the rank 2^s
    below them the blocks of it and of every 2^(s+1)-th rank below it, floor((n - 1 + 2^s) /
    2^(s+1)) of them, as far as they hold them."""
    L = ceil_log2(n)
    steps = []
    for s in range(L):
        d = 1 << s
        ranks = n - d if (n & (n - 1)) and s == L - 1 else d
        cnt = (n - 1 + d) // (2 * d)
        triples = []
        for delta in range(ranks):
            rank = (root - delta) % n
            to = (rank - d) % n
            triples.append((rank, to, [(to - k * 2 * d) % n for k in range(cnt)]))
        steps.append(triples)
    return held_rounds(n, root, steps)
