"""Pipeline (HCCL Pipeline.md; templates all_gather_pipeline.cc, reduce_scatter_pipeline.cc,
all_reduce_opbase_pipeline.cc): the inter-server ring among same-index cards overlapped with
intra-server mesh forwarding. Equal servers of k >= 2 cards, m >= 2 servers; level0 is the mesh.

Card (s, i) is global rank s k + i; block g(x, j) belongs to card j of server x.
- AllGather: m steps. In step t card (s, i) holds g(s - t, i) (its own input at t = 0): it
  forwards it around the ring to (s+1, i) and, in the same step, over the mesh to every local
  card. Cost (m-1) max(a_inter + n/p b_inter, a_intra + n/p b_intra) + a_intra + n/p b_intra.
- ReduceScatter: m steps, ring towards (s-1, i). In step t card (s, i) accumulates block
  g(s + t + 1, i): its own share, every local card's share (pushed over the mesh) and the partial
  arriving from (s+1, i), which sent it on in the same step; the last block is its own, reduced
  straight into the output. Same cost form, plus reductions.
- AllReduce: that ReduceScatter over m k chunks (chunk g(x, j) = x k + j, partials kept in
  place in the output), then an AllGather in the same ring direction: twice the cost.
"""
from __future__ import annotations

import numpy as np

from hcomm.program import LazyStep, TimingView

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder, bounds

NAME = "pipeline"
COLLECTIVES = ("allreduce", "reducescatter", "allgather")
LEVELS = ("level1",)
DESCRIPTION = "inter-server ring overlapped with intra-server mesh forwarding"


class _Layout:
    def __init__(self, srv):
        K, m = srv.K, srv.m
        self.K, self.m, self.p = K, m, srv.p
        self.r = np.arange(srv.p)
        self.s, self.i = np.divmod(self.r, K)
        a, b = np.divmod(np.arange(K * K), K)
        keep = a != b
        a, b = a[keep], b[keep]
        o = np.lexsort((a, (b - a) % K))          # round-robin issue order, as the mesh
        a, b = a[o], b[o]
        base = np.repeat(np.arange(m) * K, len(a))
        self.ms = base + np.tile(a, m)            # mesh sender
        self.md = base + np.tile(b, m)            # mesh receiver
        self.prev = ((self.s - 1) % m) * K + self.i
        self.next = ((self.s + 1) % m) * K + self.i


def _steps(count, full, timing, key):
    return [LazyStep(lambda t=t: full(t), lambda t=t: timing(t), key(t)) for t in range(count)]


def _view(src, dst, nbytes, reduce, c_rank=np.empty(0, dtype=np.int64), c_bytes=np.empty(0, dtype=np.int64)):
    return TimingView(src, dst, nbytes, np.full(len(src), 1 if reduce else -1), c_rank, c_bytes)


def allgather(srv, unit: int) -> list:
    """Rows: output row x k + j is card (x, j)'s block; each card's input is one row."""
    L = _Layout(srv)
    K, m = L.K, L.m

    def full(t):
        row = ((L.s - t) % m) * K + L.i
        b = StepBuilder()
        if t == 0:
            b.copies(L.r, unit, INPUT, 0, 1, OUTPUT, row)
            sbuf, slo = INPUT, np.zeros(L.p, dtype=np.int64)
        else:
            sbuf, slo = OUTPUT, row
        if t < m - 1:
            b.transfers(L.r, L.next, unit, sbuf, slo, slo + 1, OUTPUT, row)
        b.transfers(L.ms, L.md, unit, sbuf, slo[L.ms], slo[L.ms] + 1, OUTPUT, row[L.ms])
        return b.build()

    def timing(t):
        src = np.concatenate([L.r, L.ms]) if t < m - 1 else L.ms
        dst = np.concatenate([L.next, L.md]) if t < m - 1 else L.md
        c = L.r if t == 0 else np.empty(0, dtype=np.int64)
        return _view(src, dst, np.full(len(src), unit), False, c, np.full(len(c), unit))
    return _steps(m, full, timing, lambda t: ("pipe-ag", L.p, K, unit, min(t, 1), t < m - 1))


def reducescatter(srv, unit: int) -> list:
    """Rows: input and scratch hold p blocks (row x k + j); the result is output row 0."""
    L = _Layout(srv)
    K, m = L.K, L.m

    def acc_of(t, ranks):
        """Where card `ranks` accumulates in step t: (buffer, row)."""
        if t == m - 1:
            return OUTPUT, np.zeros(len(ranks), dtype=np.int64)
        return SCRATCH, ((L.s[ranks] + t + 1) % m) * K + L.i[ranks]

    def full(t):
        own = ((L.s + t + 1) % m) * K + L.i
        tbuf, trow = acc_of(t, L.r)
        b = StepBuilder().copies(L.r, unit, INPUT, own, own + 1, tbuf, trow)
        if t > 0:
            _, before = acc_of(t - 1, L.r)              # the partial finished last step
            rbuf, rrow = acc_of(t, L.prev)
            b.transfers(L.r, L.prev, unit, SCRATCH, before, before + 1, rbuf, rrow, rbuf=rbuf, rlo=rrow)
        b.transfers(L.ms, L.md, unit, INPUT, own[L.md], own[L.md] + 1, tbuf, trow[L.md], rbuf=tbuf, rlo=trow[L.md])
        return b.build()

    def timing(t):
        src = np.concatenate([L.r, L.ms]) if t > 0 else L.ms
        dst = np.concatenate([L.prev, L.md]) if t > 0 else L.md
        return _view(src, dst, np.full(len(src), unit), True, L.r, np.full(L.p, unit))
    return _steps(m, full, timing, lambda t: ("pipe-rs", L.p, K, unit, t > 0))


def allreduce(srv, N: int, unit: int) -> list:
    """A vector of N elements; results in place in the output."""
    L = _Layout(srv)
    K, m = L.K, L.m
    chunks = bounds(N, m * K)
    sizes = (chunks[1:] - chunks[:-1]) * unit
    uniform = sizes.min() == sizes.max()

    def chunk(x, j):
        c = x * K + j
        return chunks[c], chunks[c + 1], c

    def rs_full(t):
        a, b_, _ = chunk((L.s + t + 1) % m, L.i)
        st = StepBuilder().copies(L.r, unit, INPUT, a, b_, OUTPUT, a)
        if t > 0:
            pa, pb, _ = chunk((L.s + t) % m, L.i)
            st.transfers(L.r, L.prev, unit, OUTPUT, pa, pb, OUTPUT, pa, rbuf=OUTPUT, rlo=pa)
        st.transfers(L.ms, L.md, unit, INPUT, a[L.md], b_[L.md], OUTPUT, a[L.md], rbuf=OUTPUT, rlo=a[L.md])
        return st.build()

    def rs_timing(t):
        _, _, c = chunk((L.s + t + 1) % m, L.i)
        mesh_bytes = sizes[c][L.md]
        if t > 0:
            _, _, pc = chunk((L.s + t) % m, L.i)
            return _view(np.concatenate([L.r, L.ms]), np.concatenate([L.prev, L.md]),
                         np.concatenate([sizes[pc], mesh_bytes]), True, L.r, sizes[c])
        return _view(L.ms, L.md, mesh_bytes, True, L.r, sizes[c])

    def ag_full(t):
        a, b_, _ = chunk((L.s + t) % m, L.i)
        st = StepBuilder()
        if t < m - 1:
            st.transfers(L.r, L.prev, unit, OUTPUT, a, b_, OUTPUT, a)
        st.transfers(L.ms, L.md, unit, OUTPUT, a[L.ms], b_[L.ms], OUTPUT, a[L.ms])
        return st.build()

    def ag_timing(t):
        _, _, c = chunk((L.s + t) % m, L.i)
        if t < m - 1:
            return _view(np.concatenate([L.r, L.ms]), np.concatenate([L.prev, L.md]),
                         np.concatenate([sizes[c], sizes[c][L.ms]]), False)
        return _view(L.ms, L.md, sizes[c][L.ms], False)

    def key(phase):
        return (lambda t: ("pipe-ar", phase, L.p, K, int(sizes[0]), min(t, 1), t < m - 1)) if uniform else (lambda t: None)
    return (_steps(m, rs_full, rs_timing, key("rs")) + _steps(m, ag_full, ag_timing, key("ag")))


def allgatherv(srv, offs, unit: int, buf=OUTPUT) -> list:
    """AllGather's pipeline on blocks of their own lengths, in place in `buf` (`offs`: (lo, hi) of
    every rank's block, each already at its owner), as HCCL's AllGatherVMeshOpbasePipeline
    forwards them: in step t card (s, i) passes block g(s - t, i) on around the ring and over
    the mesh."""
    L = _Layout(srv)
    K, m = L.K, L.m
    lo, hi = (np.asarray(a, dtype=np.int64) for a in offs)
    steps = []
    for t in range(m):
        g = ((L.s - t) % m) * K + L.i
        b = StepBuilder()
        if t < m - 1:
            b.transfers(L.r, L.next, unit, buf, lo[g], hi[g], buf, lo[g])
        gm = g[L.ms]
        b.transfers(L.ms, L.md, unit, buf, lo[gm], hi[gm], buf, lo[gm])
        steps.append(b.build())
    return steps


def reducescatterv(srv, offs, unit: int, src=INPUT, acc=SCRATCH, out=OUTPUT, out_lo=None) -> list:
    """ReduceScatter's pipeline on blocks of their own lengths (`offs`: (lo, hi) of every rank's
    block in src; partials in acc at the same places; rank r's result at out[out_lo[r]]), as
    HCCL's ReduceScatterVMeshOpbasePipeline accumulates them: in step t card (s, i) gathers block
    g(s + t + 1, i) from its own input, every local card's and the partial from (s + 1, i)."""
    L = _Layout(srv)
    K, m = L.K, L.m
    lo, hi = (np.asarray(a, dtype=np.int64) for a in offs)
    out_lo = np.zeros(L.p, dtype=np.int64) if out_lo is None else np.asarray(out_lo, dtype=np.int64)

    def acc_of(t, ranks):
        g = ((L.s[ranks] + t + 1) % m) * K + L.i[ranks]
        if t == m - 1:
            return out, out_lo[ranks], g
        return acc, lo[g], g

    steps = []
    for t in range(m):
        tbuf, tlo, g = acc_of(t, L.r)
        b = StepBuilder().copies(L.r, unit, src, lo[g], hi[g], tbuf, tlo)
        if t > 0:
            _, before, gb = acc_of(t - 1, L.r)
            rbuf, rlo, _ = acc_of(t, L.prev)
            b.transfers(L.r, L.prev, unit, acc, before, before + (hi[gb] - lo[gb]), rbuf, rlo, rbuf=rbuf, rlo=rlo)
        gm = g[L.md]
        b.transfers(L.ms, L.md, unit, src, lo[gm], hi[gm], tbuf, tlo[L.md], rbuf=tbuf, rlo=tlo[L.md])
        steps.append(b.build())
    return steps
