"""Helpers shared by the schedule builders.

Builders are vectorised over the participants of a collective: they describe global step t for
all local ranks 0..n-1 at once with numpy arrays (hcomm.program). A sub-collective (the
inter-server AllReduce among same-index cards, the intra-server mesh of every server) is built
once for n participants and then tiled onto groups of global ranks, shifting buffer slices
per group (`tile`).
"""
from __future__ import annotations

import numpy as np

from hcomm.program import (ARRAYS, INPUT, NONE, OUTPUT, SCRATCH, GlobalStep, LazyStep, StepBuilder, TimingView, compacted,
                           counts, merge_parallel)
from hcomm.vgroups import Part

__all__ = ["INPUT", "OUTPUT", "SCRATCH", "NONE", "Step", "StepBuilder", "compacted", "bounds", "fold", "tile",
           "relay_scatter", "held_rounds",
           "merge_runs", "local_copy", "ceil_log2", "blocks", "spread", "repeat_rows", "relabel_rows",
           "single_rank_reducescatter"]


def bounds(n: int, parts: int) -> np.ndarray:
    """Boundaries splitting n units into `parts` contiguous chunks whose sizes differ by at most one."""
    return (np.arange(parts + 1, dtype=np.int64) * n) // parts


def blocks(offs):
    """(lo, hi) of every rank's block: from bounds (n + 1 boundaries) or a (lo, hi) pair."""
    if isinstance(offs, tuple):
        return np.asarray(offs[0], dtype=np.int64), np.asarray(offs[1], dtype=np.int64)
    offs = np.asarray(offs, dtype=np.int64)
    return offs[:-1], offs[1:]


def ceil_log2(n: int) -> int:
    return (n - 1).bit_length() if n > 1 else 0


def fold(p: int):
    """HCCL's RHD fold (RHD.md): block = 2^floor(log2 p), rem = p - block."""
    block = 1 << (p.bit_length() - 1)
    return block, p - block


def local_copy(n: int, count: int, unit: int, src=INPUT, dst=OUTPUT, src_lo=0, dst_lo=0) -> list:
    """Every rank copies `count` units from src to dst (a one-rank collective)."""
    if count == 0:
        return []
    return [StepBuilder().copies(np.arange(n), unit, src, src_lo, src_lo + count, dst, dst_lo).build()]


def relay_broadcast(rounds, N: int, unit: int, root: int, src, dst) -> list:
    """Broadcast steps from (senders, receivers) rounds: the root sends from src (and copies it to
    dst in the first step), every other sender forwards what it received in dst."""
    steps = []
    for k, (senders, receivers) in enumerate(rounds):
        senders = np.asarray(senders, dtype=np.int64)
        b = StepBuilder().transfers(senders, receivers, unit, np.where(senders == root, src, dst), 0, N, dst, 0)
        if k == 0 and src != dst:
            b.copies([root], unit, src, 0, N, dst, 0)
        steps.append(b.build())
    return steps


def relay_scatter(rounds, offs, unit: int, root: int, src, relay, dst=None, dst_lo=None) -> list:
    """Scatter steps from (senders, receivers, blocks) rounds (participant indices; block b at
    offs[b]..offs[b+1], b's owner participant b): the root sends from src, every other sender
    forwards what it received; a block reaching its owner lands in dst at dst_lo[owner] (with
    `dst`; else every block lands in relay at its own place, for a level above a level0 that
    scatters further). The root's own block is copied into dst in the first step."""
    offs = np.asarray(offs, dtype=np.int64)
    n = len(offs) - 1
    dst_lo = np.zeros(n, dtype=np.int64) if dst_lo is None else np.asarray(dst_lo, dtype=np.int64)
    steps = []
    for k, (senders, receivers, blks) in enumerate(rounds):
        senders, receivers, blks = (np.asarray(a, dtype=np.int64) for a in (senders, receivers, blks))
        final = (receivers == blks) if dst is not None else np.zeros(len(blks), dtype=bool)
        b = StepBuilder().transfers(senders, receivers, unit, np.where(senders == root, src, relay), offs[blks],
                                    offs[blks + 1], np.where(final, relay if dst is None else dst, relay),
                                    np.where(final, dst_lo[blks], offs[blks]))
        if k == 0 and dst is not None:
            b.copies([root], unit, src, offs[root], offs[root + 1], dst, dst_lo[root])
        steps.append(b.build())
    if not rounds and dst is not None:
        steps.append(StepBuilder().copies([root], unit, src, offs[root], offs[root + 1], dst, dst_lo[root]).build())
    return steps


def held_rounds(n: int, root: int, steps) -> list:
    """Scatter rounds from `steps`: per step, (sender, receiver, candidate blocks) triples; a sender
    passes on the candidates it holds (the root holds every block), which its receiver then holds."""
    held = [set() for _ in range(n)]
    held[root] = set(range(n))
    rounds = []
    for triples in steps:
        s_, r_, b_ = [], [], []
        moved = []
        for snd, rcv, cands in triples:
            for blk in cands:
                if blk in held[snd] and blk != snd:
                    s_.append(snd)
                    r_.append(rcv)
                    b_.append(blk)
                    moved.append((rcv, blk))
        for rcv, blk in moved:
            held[rcv].add(blk)
        rounds.append((s_, r_, b_))
    return rounds


def single_rank_reducescatter(offs, unit, src, out, out_lo, block: int = 0) -> list:
    """A one-rank ReduceScatter: its block, copied into place unless it is there already."""
    if src == out and offs[block] == out_lo[0]:
        return []
    return [StepBuilder().copies([0], unit, src, offs[block], offs[block + 1], out, out_lo[0]).build()]


def merge_runs(src, dst, sbuf, slo, shi, dbuf, dlo, rbuf, rlo):
    """Merge transfers of one step that continue each other (same ranks and buffers, adjacent
    slices on both sides) into single transfers, as HCCL's MergeSlices does. The timing model
    prices k adjacent transfers on one port the same as their merge; this just keeps programs small."""
    if len(src) <= 1:
        return src, dst, sbuf, slo, shi, dbuf, dlo, rbuf, rlo
    # one int64 key (pair, then position) sorts faster than a six-key lexsort
    span = int(max(shi.max(), 1)) + 1
    order = np.argsort((src * (int(dst.max()) + 1) + dst) * span + slo, kind="stable")
    src, dst, sbuf, slo, shi, dbuf, dlo, rbuf, rlo = (a[order] for a in (src, dst, sbuf, slo, shi, dbuf, dlo, rbuf, rlo))
    length = shi - slo
    cont = np.zeros(len(src), dtype=bool)
    cont[1:] = ((src[1:] == src[:-1]) & (dst[1:] == dst[:-1]) & (sbuf[1:] == sbuf[:-1]) & (dbuf[1:] == dbuf[:-1])
                & (rbuf[1:] == rbuf[:-1]) & (slo[1:] == shi[:-1]) & (dlo[1:] == dlo[:-1] + length[:-1])
                & ((rbuf[1:] < 0) | (rlo[1:] == rlo[:-1] + length[:-1])))
    starts = np.flatnonzero(~cont)
    ends = np.append(starts[1:], len(src)) - 1
    return (src[starts], dst[starts], sbuf[starts], slo[starts], shi[ends], dbuf[starts], dlo[starts],
            rbuf[starts], rlo[starts])


def _tile_full(st, ranks, shift) -> GlobalStep:
    G = ranks.shape[0]
    new = GlobalStep()
    if len(st.t_src):
        def sh(buf, lo):
            return (lo[None, :] + np.where(buf[None, :] >= 0, shift[:, np.maximum(buf, 0)], 0)).reshape(-1)
        new.t_src = ranks[:, st.t_src].reshape(-1)
        new.t_dst = ranks[:, st.t_dst].reshape(-1)
        new.t_bytes = np.tile(st.t_bytes, G)
        new.t_sbuf, new.t_dbuf, new.t_rbuf = (np.tile(a, G) for a in (st.t_sbuf, st.t_dbuf, st.t_rbuf))
        new.t_slo, new.t_shi = sh(st.t_sbuf, st.t_slo), sh(st.t_sbuf, st.t_shi)
        new.t_dlo, new.t_dhi = sh(st.t_dbuf, st.t_dlo), sh(st.t_dbuf, st.t_dhi)
        new.t_rlo, new.t_rhi = sh(st.t_rbuf, st.t_rlo), sh(st.t_rbuf, st.t_rhi)
    if len(st.c_rank):
        new.c_rank = ranks[:, st.c_rank].reshape(-1)
        new.c_sbuf, new.c_dbuf, new.c_bytes = np.tile(st.c_sbuf, G), np.tile(st.c_dbuf, G), np.tile(st.c_bytes, G)
        new.c_slo = (st.c_slo[None, :] + shift[:, st.c_sbuf]).reshape(-1)
        new.c_shi = (st.c_shi[None, :] + shift[:, st.c_sbuf]).reshape(-1)
        new.c_dlo = (st.c_dlo[None, :] + shift[:, st.c_dbuf]).reshape(-1)
        new.c_dhi = (st.c_dhi[None, :] + shift[:, st.c_dbuf]).reshape(-1)
        new.c_rbuf = np.tile(st.c_rbuf, G)
        rshift = np.where(st.c_rbuf[None, :] >= 0, shift[:, np.maximum(st.c_rbuf, 0)], 0)
        new.c_rlo = (st.c_rlo[None, :] + rshift).reshape(-1)
        new.c_rhi = (st.c_rhi[None, :] + rshift).reshape(-1)
    if len(st.g_rank):
        new.g_rank = ranks[:, st.g_rank].reshape(-1)
        new.g_bytes, new.g_dir = np.tile(st.g_bytes, G), np.tile(st.g_dir, G)
    return new


def _tile_timing(view, ranks) -> TimingView:
    G = ranks.shape[0]
    c = counts(view)                       # a compacted view stays compacted: its runs tile as runs
    grouped = view.expand
    return TimingView(ranks[:, view.t_src].reshape(-1), ranks[:, view.t_dst].reshape(-1), np.tile(view.t_bytes, G),
                      np.tile(view.t_rbuf, G), ranks[:, view.c_rank].reshape(-1), np.tile(view.c_bytes, G),
                      ranks[:, view.g_rank].reshape(-1), np.tile(view.g_bytes, G), None if c is None else np.tile(c, G),
                      None if grouped is None else (lambda: _tile_timing(grouped(), ranks)), np.tile(view.c_rbuf, G))


_EAGER_OPS = 1 << 16


def tile(program: list, ranks, shifts=None) -> list:
    """Place a program built for n local ranks onto G groups of global ranks.

    Args:
        ranks: (G, n) array, ranks[g, i] = global rank of local rank i in group g.
        shifts: optional (G, 3) array of first-axis offsets added to slices of input, output,
            scratch in group g.
    Small steps are tiled at once; large ones lazily (hcomm.program.LazyStep), keeping the
    sub-step's timing key so that identical steps are priced once. Every tiled step keeps its
    sub-step and groups (hcomm.vgroups.Part): the timing engine prices the sub-step once for
    all groups.
    """
    ranks = np.atleast_2d(np.asarray(ranks, dtype=np.int64))
    G = ranks.shape[0]
    shift = np.zeros((G, 3), dtype=np.int64) if shifts is None else np.asarray(shifts, dtype=np.int64).reshape(G, 3)
    key = hash((ranks.tobytes(), ranks.shape))
    out = []
    for st in program:
        skey = None if st.skey is None else ("tile", st.skey, key)
        groups = (Part(st, ranks, key),)
        if isinstance(st, GlobalStep) and G * (len(st.t_src) + len(st.c_rank) + len(st.g_rank)) <= _EAGER_OPS:
            new = _tile_full(st, ranks, shift)
            new.tkey = None if st.tkey is None else ("tile", st.tkey, key)
            new.skey = skey
            new.groups = groups
            out.append(new)
        else:
            out.append(LazyStep(lambda st=st: _tile_full(st.full(), ranks, shift),
                                lambda st=st: _tile_timing(st.timing(), ranks),
                                None if st.tkey is None else ("tile", st.tkey, key), skey, groups))
    return out


def _rebuffer_full(st, frm: int, to: int, shift: int) -> GlobalStep:
    new = GlobalStep()
    for name in st.__slots__:
        if name not in ("cache", "tview"):
            setattr(new, name, getattr(st, name))
    for prefix, parts in (("t", ("s", "d", "r")), ("c", ("s", "d", "r"))):
        for part in parts:
            buf = getattr(st, f"{prefix}_{part}buf")
            if not len(buf):
                continue
            hit = buf == frm
            if hit.any():
                setattr(new, f"{prefix}_{part}buf", np.where(hit, to, buf))
                for end in ("lo", "hi"):
                    name = f"{prefix}_{part}{end}"
                    setattr(new, name, np.where(hit, getattr(st, name) + shift, getattr(st, name)))
    new.cache = {}
    return new


def rebuffered(program: list, frm: int, to: int, shift: int) -> list:
    """The program with every slice of buffer `frm` moved to buffer `to`, `shift` units on: how
    a schedule built to read its input reads a copy of it in scratch, apart from the scratch
    area it accumulates in. Timing is unchanged (it never looks at buffers)."""
    out = []
    for st in program:
        if isinstance(st, GlobalStep):
            new = _rebuffer_full(st, frm, to, shift)
            new.tview = st.tview
            out.append(new)
        else:
            out.append(LazyStep(lambda st=st: _rebuffer_full(st.full(), frm, to, shift), st.timing, st.tkey, st.skey,
                                st.groups))
    return out


def sequence(*programs) -> list:
    """Phases one after another."""
    out = []
    for prog in programs:
        out.extend(prog)
    return out


def side_by_side(*programs) -> list:
    """Programs on disjoint ranks or data, step t of each in global step t."""
    return merge_parallel(list(programs))


def _spread_slices(lo, hi, buf, strides, counts):
    """Unit slices of [lo, hi) (k = counts units each, zero-length slices kept as one), each start
    mapped to start * stride of its buffer."""
    start = np.repeat(lo, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    start = start * strides[np.maximum(np.repeat(buf, counts), 0)]
    unit_len = np.repeat(np.minimum(hi - lo, 1), counts)
    return start, start + unit_len


def spread(program: list, strides) -> list:
    """A program whose unit i of buffer b sits at unit i * strides[b]: every slice is cut into
    single units and each placed at its strided position. How a sub-collective addresses rows
    that are not adjacent (A3's level1 peers each hold every N0-th row of the output), where
    `tile` can only shift. Slices stay one unit long after `tile` shifts them."""
    strides = np.asarray(strides, dtype=np.int64)
    out = []
    for st in program:
        st = st.full()
        new = GlobalStep()
        if len(st.t_src):
            k = st.t_shi - st.t_slo
            counts = np.maximum(k, 1)
            rep = lambda a: np.repeat(a, counts)                      # noqa: E731
            new.t_src, new.t_dst = rep(st.t_src), rep(st.t_dst)
            new.t_bytes = rep(np.where(k > 0, st.t_bytes // counts, st.t_bytes))
            new.t_sbuf, new.t_dbuf, new.t_rbuf = rep(st.t_sbuf), rep(st.t_dbuf), rep(st.t_rbuf)
            new.t_slo, new.t_shi = _spread_slices(st.t_slo, st.t_shi, st.t_sbuf, strides, counts)
            new.t_dlo, new.t_dhi = _spread_slices(st.t_dlo, st.t_dhi, st.t_dbuf, strides, counts)
            rlo, rhi = _spread_slices(st.t_rlo, st.t_rhi, st.t_rbuf, strides, counts)
            has_r = new.t_rbuf >= 0
            new.t_rlo, new.t_rhi = np.where(has_r, rlo, 0), np.where(has_r, rhi, 0)
        if len(st.c_rank):
            k = st.c_shi - st.c_slo
            counts = np.maximum(k, 1)
            rep = lambda a: np.repeat(a, counts)                      # noqa: E731
            new.c_rank, new.c_sbuf, new.c_dbuf = rep(st.c_rank), rep(st.c_sbuf), rep(st.c_dbuf)
            new.c_bytes = rep(np.where(k > 0, st.c_bytes // counts, st.c_bytes))
            new.c_slo, new.c_shi = _spread_slices(st.c_slo, st.c_shi, st.c_sbuf, strides, counts)
            new.c_dlo, new.c_dhi = _spread_slices(st.c_dlo, st.c_dhi, st.c_dbuf, strides, counts)
            new.c_rbuf = rep(st.c_rbuf)
            rlo, rhi = _spread_slices(st.c_rlo, st.c_rhi, st.c_rbuf, strides, counts)
            has_r = new.c_rbuf >= 0
            new.c_rlo, new.c_rhi = np.where(has_r, rlo, 0), np.where(has_r, rhi, 0)
        new.g_rank, new.g_bytes, new.g_dir = st.g_rank, st.g_bytes, st.g_dir
        out.append(new)
    return out


def _repeat_full(st, q: int, strides) -> GlobalStep:
    new = GlobalStep()
    for prefix, slices in (("t_", ("s", "d", "r")), ("c_", ("s", "d", "r"))):
        src = getattr(st, f"{prefix}src" if prefix == "t_" else "c_rank")
        n = len(src)
        if not n:
            continue
        for name in ARRAYS:
            if name.startswith(prefix):
                setattr(new, name, np.repeat(np.asarray(getattr(st, name)), q))
        copy_i = np.tile(np.arange(q, dtype=np.int64), n)
        for s in slices:
            buf = getattr(new, f"{prefix}{s}buf")
            off = copy_i * strides[np.maximum(buf, 0)] * (buf >= 0)
            setattr(new, f"{prefix}{s}lo", getattr(new, f"{prefix}{s}lo") + off)
            setattr(new, f"{prefix}{s}hi", getattr(new, f"{prefix}{s}hi") + off)
    if len(st.g_rank):
        new.g_rank, new.g_bytes, new.g_dir = (np.repeat(np.asarray(a), q) for a in (st.g_rank, st.g_bytes, st.g_dir))
    return compacted(new)


def _repeat_timing(view, q: int) -> TimingView:
    c = counts(view)
    rep = lambda a: np.repeat(np.asarray(a), q)          # noqa: E731
    grouped = view.expand
    return TimingView(view.t_src, view.t_dst, view.t_bytes, view.t_rbuf, rep(view.c_rank), rep(view.c_bytes),
                      rep(view.g_rank), rep(view.g_bytes),
                      np.full(len(view.t_src), q, dtype=np.int64) if c is None else c * q,
                      None if grouped is None else (lambda: _repeat_timing(grouped(), q)), rep(view.c_rbuf))


def repeat_rows(program: list, q: int, strides) -> list:
    """The program run on q row sets at once: every slice repeated q times, copy i at offset
    i * strides[b] of its buffer b, the q copies of a transfer one after another (a level of a
    block collective whose ranks each hold q rows apart: the 950's and A3's level0 moves rows
    i * N0 + d of every i). The steps are built on demand; their timing view is the base step's,
    each transfer q times over between the same two ranks, so that q x n transfers cost what n
    do to price (`tile` of the base program once per row set listed the same transfers as q
    overlapping groups: p(p-1) rows, 256 GiB at a SuperCluster's scale)."""
    strides = np.asarray(strides, dtype=np.int64)
    out = []
    for st in program:
        out.append(LazyStep(lambda st=st: _repeat_full(st.full(), q, strides),
                            lambda st=st: _repeat_timing(st.timing(), q),
                            None if st.tkey is None else ("rows", st.tkey, q),
                            None if st.skey is None else ("rows", st.skey, q)))
    return out


def _relabel_full(st, buf: int, rows) -> GlobalStep:
    new = GlobalStep()
    for name in ARRAYS:
        setattr(new, name, np.asarray(getattr(st, name)))
    for prefix in ("t_", "c_"):
        for side in ("s", "d", "r"):
            on = getattr(new, f"{prefix}{side}buf") == buf
            if on.any():
                lo, hi = getattr(new, f"{prefix}{side}lo"), getattr(new, f"{prefix}{side}hi")
                length = hi - lo
                if (length[on] > 1).any():
                    raise ValueError("relabel_rows: a slice of more than one row cannot be renamed row by row")
                moved = np.where(on, rows[np.where(on, lo, 0)], lo)
                setattr(new, f"{prefix}{side}lo", moved)
                setattr(new, f"{prefix}{side}hi", np.where(on, moved + length, hi))
    return new


def one_row_each(program: list) -> list:
    """The program with every transfer and copy of more than one row cut into one-row ones, in
    row order, each its share of the bytes: a block collective's strided rows (relabel_rows
    renames rows one by one), priced as the rows one after another, as a level's row sets are
    (repeat_rows)."""
    out = []
    for st in program:
        st, new = st.full(), GlobalStep()
        for prefix, who, nbytes in (("t_", "t_src", "t_bytes"), ("c_", "c_rank", "c_bytes")):
            if not len(getattr(st, who)):
                continue
            rows = np.maximum(np.asarray(getattr(st, f"{prefix}shi")) - getattr(st, f"{prefix}slo"), 1)
            piece = np.arange(int(rows.sum()), dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
            for name in ARRAYS:
                if name.startswith(prefix):
                    setattr(new, name, np.repeat(np.asarray(getattr(st, name)), rows))
            setattr(new, nbytes, np.repeat(np.asarray(getattr(st, nbytes)) // rows, rows))
            for side in ("s", "d", "r"):
                on = getattr(new, f"{prefix}{side}buf") != NONE
                lo = np.where(on, getattr(new, f"{prefix}{side}lo") + piece, getattr(new, f"{prefix}{side}lo"))
                setattr(new, f"{prefix}{side}lo", lo)
                setattr(new, f"{prefix}{side}hi", np.where(on, lo + 1, getattr(new, f"{prefix}{side}hi")))
        new.g_rank, new.g_bytes, new.g_dir = st.g_rank, st.g_bytes, st.g_dir
        out.append(compacted(new))
    return out


def relabel_rows(program: list, buf: int, rows) -> list:
    """The program with row q of buffer `buf` renamed rows[q] (slices on it one row long): a block
    collective built on a view whose positions are not the ranks' rows (the 950's Parallel part
    that crosses servers first, Pods.transposed) moved to the ranks' rows. Timing is the same."""
    rows = np.asarray(rows, dtype=np.int64)
    return [LazyStep(lambda st=st: _relabel_full(st.full(), buf, rows), st.timing, st.tkey, st.skey, st.groups)
            for st in program]
