"""HCCL's two-level decomposition (docs/references.md §6.4; HCCL's "algo_intro.md"): level0 inside each
server, level1 among the same-index cards of all servers.

| op            | phase 1                 | phase 2                         | phase 3           |
| AllReduce     | intra ReduceScatter     | inter AllReduce of one's chunk  | intra AllGather   |
| AllGather     | intra AllGather         | inter AllGather of server regions |                 |
| ReduceScatter | inter ReduceScatter of server regions | intra ReduceScatter |               |
| Broadcast     | intra Scatter (root's server) | inter Broadcast of one's chunk | intra AllGather |
| Reduce        | intra ReduceScatter     | inter Reduce of one's chunk     | intra Gather      |
| AlltoAll      | intra (regroup by destination card) | inter pairwise of k-block bundles |      |

As in HCCL's AllGatherMeshExecutor, the inter-server AllGather moves whole server regions
(each same-index card group carries all of its server's data). Vector ops split the data into
K = max cards-per-server chunks; on a server with k < K cards, card i owns chunks i, i + k, ...,
so servers with unequal card counts still decompose (AllReduce, AllGather, Broadcast, Reduce).
ReduceScatter and AlltoAll need equal servers; otherwise the planner runs them flat.
Groups of same-index cards run side by side (a card owning several chunks runs their groups at
once).
"""
from __future__ import annotations

import numpy as np

from . import mesh, nhr, pairwise, pipeline, registry, ring
from .common import (INPUT, OUTPUT, SCRATCH, StepBuilder, blocks, bounds, relay_scatter, sequence, side_by_side,
                     tile)

LEVEL0 = {"fullmesh": mesh, "ring": ring}


def _level1(name: str, collective: str):
    """The module of a level1 algorithm (registry), checked to build `collective`."""
    algo = registry.get(name)
    if not algo.supports(collective, "level1"):
        raise ValueError(f"{name} does not build level1 {collective}")   # the planner checked this
    return algo.module


class Servers:
    """The server structure the hierarchy needs: ranks of every server (contiguous runs)."""

    def __init__(self, server_of):
        so = np.asarray(server_of, dtype=np.int64)
        self.m = int(so.max()) + 1 if len(so) else 0
        # one stable sort, not a scan of every rank per server (16,384 servers: 2 * 10^9 compares)
        self.k = np.bincount(so, minlength=self.m).astype(np.int64)
        self._rank_order = np.argsort(so, kind="stable")
        self.ranks = np.split(self._rank_order, np.cumsum(self.k)[:-1]) if self.m else []
        self.K = int(self.k.max()) if self.m else 0
        self.equal = bool((self.k == self.K).all())
        self.start = np.append(self._rank_order[np.cumsum(self.k) - self.k], len(so)).astype(np.int64)
        self.p = len(so)

    def group(self, i) -> np.ndarray:
        """Level1 participants for chunk (card index) i: its owner on every server."""
        if self.equal:
            return self.matrix()[:, i % self.K].copy()
        return np.array([self.ranks[s][i % self.k[s]] for s in range(self.m)], dtype=np.int64)

    def matrix(self) -> np.ndarray:
        """(m, K) ranks of equal servers (built once; callers do not write to it)."""
        got = getattr(self, "_matrix", None)
        if got is None:
            got = self._matrix = self._rank_order.reshape(self.m, self.K)
        return got


def _per_server(srv, build):
    """Build a level0 program per distinct card count and tile it onto those servers."""
    progs = []
    for k in np.unique(srv.k):
        ranks = srv.matrix() if srv.equal else np.stack([srv.ranks[s] for s in range(srv.m) if srv.k[s] == k])
        progs.append(tile(build(int(k)), ranks))
    return side_by_side(*progs)


def _level1_chunks(srv, chunks, build):
    """Level1 among group i for every chunk i, grouped by chunk length (at most two)."""
    lengths = chunks[1:] - chunks[:-1]
    progs = []
    for length in np.unique(lengths):
        idx = np.flatnonzero(lengths == length)
        ranks = np.stack([srv.group(i) for i in idx])
        shifts = np.repeat(chunks[idx][:, None], 3, axis=1)
        progs.append(tile(build(int(length)), ranks, shifts))
    return side_by_side(*progs)


def _owner(srv, k):
    return np.arange(srv.K) % k


def allreduce(srv: Servers, N: int, unit: int, l0: str, l1: str, oneshot=None) -> list:
    chunks = bounds(N, srv.K)
    phases = []
    if srv.K > 1:
        if srv.equal and l0 == "ring":
            phases.append(tile(ring.reducescatter(srv.K, chunks, unit, INPUT, OUTPUT, OUTPUT, chunks[:-1]),
                               srv.matrix()))
        else:
            phases.append(_per_server(srv, lambda k: mesh.reducescatter(
                k, chunks, unit, INPUT, OUTPUT, OUTPUT, chunks[:-1], owner=_owner(srv, k))))
    if srv.m > 1:
        src = INPUT if srv.K == 1 else OUTPUT
        mod = _level1(l1, "allreduce")
        kw = {"oneshot": oneshot} if mod is nhr else {}
        phases.append(_level1_chunks(srv, chunks, lambda n: mod.allreduce(srv.m, n, unit, src, OUTPUT, **kw)))
    if srv.K > 1:
        if srv.equal and l0 == "ring":
            phases.append(tile(ring.allgather(srv.K, chunks, unit, OUTPUT), srv.matrix()))
        else:
            phases.append(_per_server(srv, lambda k: mesh.allgather(k, chunks, unit, OUTPUT, owner=_owner(srv, k))))
    if not phases:
        return [StepBuilder().copies([0], unit, INPUT, 0, N, OUTPUT, 0).build()] if N else []
    return sequence(*phases)


def allgather(srv: Servers, unit: int, l0: str, l1: str) -> list:
    """Rows: rank r's block is output row r (servers hold contiguous runs of ranks)."""
    r = np.arange(srv.p)
    phases = [[StepBuilder().copies(r, unit, INPUT, 0, 1, OUTPUT, r).build()]]
    if srv.K > 1 and srv.equal:
        # one server's program, its output rows moved to each server's region
        phases.append(tile(LEVEL0[l0].allgather(srv.K, np.arange(srv.K + 1), unit, OUTPUT), srv.matrix(),
                           _regions(srv, OUTPUT)))
    elif srv.K > 1:
        progs = []
        for s in range(srv.m):
            k = int(srv.k[s])
            offs = srv.start[s] + np.arange(k + 1)
            progs.append(tile(LEVEL0["fullmesh"].allgather(k, offs, unit, OUTPUT), srv.ranks[s][None, :]))
        phases.append(side_by_side(*progs))
    if srv.m > 1:
        mod = _level1(l1, "allgather")
        ranks = np.stack([srv.group(i) for i in range(srv.K)])
        phases.append(tile(mod.allgather(srv.m, srv.start, unit, OUTPUT), ranks))
    return sequence(*phases)


def reducescatter(srv: Servers, unit: int, l0: str, l1: str) -> list:
    """Equal servers only. Rows: input and scratch hold p rank blocks; output one."""
    K, m = srv.K, srv.m
    phases = []
    if m > 1:
        mod = _level1(l1, "reducescatter")
        ranks = np.stack([srv.group(i) for i in range(K)])
        out, out_lo = (SCRATCH, srv.start[:-1]) if K > 1 else (OUTPUT, np.zeros(m, dtype=np.int64))
        phases.append(tile(mod.reducescatter(m, srv.start, unit, INPUT, SCRATCH, out, out_lo), ranks))
    if K > 1:
        # one server's program, its input and scratch rows moved to each server's region
        src = SCRATCH if m > 1 else INPUT
        phases.append(tile(LEVEL0[l0].reducescatter(K, np.arange(K + 1), unit, src, SCRATCH, OUTPUT,
                                                    np.zeros(K, dtype=np.int64)),
                           srv.matrix(), _regions(srv, INPUT, SCRATCH)))
    return sequence(*phases)


def _regions(srv: Servers, *buffers) -> np.ndarray:
    """`tile`'s shifts that move `buffers`' rows of a one-server program to each server's
    region (rows start[s]..), the other buffers' rows left where they are."""
    shifts = np.zeros((srv.m, 3), dtype=np.int64)
    shifts[:, list(buffers)] = srv.start[:-1, None]
    return shifts


def scatter(srv: Servers, unit: int, root: int, l0: str, l1: str) -> list:
    """Rows: the root's input and every scratch hold p blocks, each output one. As HCCL's
    ScatterMesh / ScatterRing executors: level1 among the cards with the root's index, the root
    sending each server its region (into that card's scratch), then inside every server that card
    scattering the region's blocks to its cards (level0 `l0`). Equal servers."""
    s0, i0 = _root_server(srv, root)
    K, m = srv.K, srv.m
    phases = []
    if m > 1:
        rounds = registry.module(l1).scatter_rounds(m, s0)
        dst = OUTPUT if K == 1 else None
        phases.append(tile(relay_scatter(rounds, srv.start, unit, s0, INPUT, SCRATCH, dst), srv.group(i0)[None, :]))
    if K > 1:
        rounds = registry.module(l0).scatter_rounds(K, i0)
        progs = []
        for s in range(m):
            src = INPUT if s == s0 else SCRATCH
            offs = srv.start[s] + np.arange(K + 1)
            progs.append(tile(relay_scatter(rounds, offs, unit, i0, src, SCRATCH, OUTPUT), srv.ranks[s][None, :]))
        phases.append(side_by_side(*progs))
    if not phases:
        return relay_scatter([], np.arange(2), unit, 0, INPUT, SCRATCH, OUTPUT)
    return sequence(*phases)


def _root_server(srv, root):
    s0 = int(np.searchsorted(srv.start, root, side="right") - 1)
    return s0, root - int(srv.start[s0])


def broadcast(srv: Servers, N: int, unit: int, root: int, l0: str, l1: str, oneshot=None) -> list:
    chunks = bounds(N, srv.K)
    s0, c0 = _root_server(srv, root)
    phases = []
    if srv.K > 1:
        k0 = int(srv.k[s0])
        phases.append(tile(mesh.scatter(k0, chunks, unit, c0, INPUT, OUTPUT, owner=_owner(srv, k0)),
                           srv.ranks[s0][None, :]))
    if srv.m > 1:
        mod = _level1(l1, "broadcast")
        kw = {"oneshot": oneshot} if mod is nhr else {}
        src = INPUT if srv.K == 1 else OUTPUT
        phases.append(_level1_chunks(srv, chunks, lambda n: mod.broadcast(srv.m, n, unit, s0, src, OUTPUT, **kw)))
    if srv.K > 1:
        phases.append(_per_server(srv, lambda k: mesh.allgather(k, chunks, unit, OUTPUT, owner=_owner(srv, k))))
    return sequence(*phases)


def reduce(srv: Servers, N: int, unit: int, root: int, l0: str, l1: str) -> list:
    chunks = bounds(N, srv.K)
    s0, c0 = _root_server(srv, root)
    phases = []
    if srv.K > 1:
        phases.append(_per_server(srv, lambda k: mesh.reducescatter(
            k, chunks, unit, INPUT, OUTPUT, OUTPUT, chunks[:-1], owner=_owner(srv, k))))
    if srv.m > 1:
        mod = _level1(l1, "reduce")
        src = INPUT if srv.K == 1 else OUTPUT
        phases.append(_level1_chunks(srv, chunks, lambda n: mod.reduce(srv.m, n, unit, s0, src, OUTPUT)))
    if srv.K > 1:
        k0 = int(srv.k[s0])
        phases.append(tile(mesh.gather(k0, chunks, unit, c0, OUTPUT, owner=_owner(srv, k0)), srv.ranks[s0][None, :]))
    return sequence(*phases)


def alltoall(srv: Servers, unit: int) -> list:
    """Equal servers only. Intra: card i hands local card j its blocks for card j of every server,
    bundled in scratch by destination server; inter: pairwise among same-index cards, k blocks at once."""
    K, m = srv.K, srv.m
    s_idx, i_loc = np.divmod(np.arange(srv.p), K)
    # phase 1: (s, i) -> (s, j) for every j (j == i is a local copy), one row per destination server
    src_rank = np.repeat(np.arange(srv.p), K * m)
    j = np.tile(np.repeat(np.arange(K), m), srv.p)
    dest_server = np.tile(np.arange(m), srv.p * K)
    sender_server, sender_card = s_idx[src_rank], i_loc[src_rank]
    to = sender_server * K + j
    in_row = dest_server * K + j
    sc_row = dest_server * K + sender_card
    local = to == src_rank
    # one server: row sc_row (the sender's card) is the block's place in the output already, so the
    # cards write there directly, as HCCL's single-server trace shows (no bundling, no second copy)
    land = OUTPUT if m == 1 else SCRATCH
    b = StepBuilder()
    b.copies(src_rank[local], unit, INPUT, in_row[local], in_row[local] + 1, land, sc_row[local])
    b.transfers(src_rank[~local], to[~local], unit, INPUT, in_row[~local], in_row[~local] + 1, land, sc_row[~local])
    phase1 = [b.build()]
    if m == 1:
        return phase1
    ranks = np.stack([srv.group(i) for i in range(K)])
    phase2 = tile(pairwise.alltoall(m, unit, SCRATCH, OUTPUT, rows=K), ranks)
    return sequence(phase1, phase2)


def alltoallv(srv: Servers, blocks, itemsize: int) -> list:
    """AlltoAll's hierarchy with a count per pair (`blocks`: (lengths, send offsets, receive
    offsets), [sender, receiver], elements of flat buffers). One server: one mesh step straight
    into the outputs. Equal servers: card c hands local card i its blocks for card i of every
    server, bundled in i's scratch by destination server (then source card); then pairwise among
    same-index cards, each bundle's blocks one after another to their places in the receiver's
    output (the own server's bundle copied locally). Unequal servers: pairwise over every rank."""
    lengths, soff, doff = blocks
    if srv.m <= 1:
        return mesh.alltoallv(blocks, itemsize)
    if not srv.equal:
        return pairwise.alltoallv(blocks, itemsize)
    K, m, p = srv.K, srv.m, srv.p
    ranks = srv.matrix()                                   # ranks[s, c]
    # relay[(s, i)]: blocks from cards c of server s to (t, i), ordered (t, c), at offsets in scratch
    s_of, c_of = np.divmod(np.arange(p), K)
    t, c = np.divmod(np.arange(m * K), K)
    src = ranks[s_of[:, None], c[None, :]]                 # [relay rank, (t, c)] -> the block's sender
    dest = ranks[t[None, :], c_of[:, None]]                # [relay rank, (t, c)] -> its receiver (t, i)
    size = lengths[src, dest]
    scr = np.zeros_like(size)
    np.cumsum(size[:, :-1], axis=1, out=scr[:, 1:])
    relay_rank = np.repeat(np.arange(p), m * K)
    src, dest, size, scr = src.reshape(-1), dest.reshape(-1), size.reshape(-1), scr.reshape(-1)
    go = size > 0
    local = go & (src == relay_rank)
    b = StepBuilder()
    b.copies(src[local], itemsize, INPUT, soff[src, dest][local], (soff[src, dest] + size)[local], SCRATCH,
             scr[local])
    remote = go & (src != relay_rank)
    order = np.flatnonzero(remote)
    order = order[np.lexsort((dest[order], relay_rank[order], src[order]))]       # sender-major, as AlltoAll's
    b.transfers(src[order], relay_rank[order], itemsize, INPUT, soff[src, dest][order],
                (soff[src, dest] + size)[order], SCRATCH, scr[order])
    steps = [b.build()]
    own_server = go & (s_of[relay_rank] == s_of[dest])
    for k in range(1, m):
        b = StepBuilder()
        if k == 1:                         # the own server's bundle, during the first exchange (as pairwise)
            sel = own_server
            b.copies(relay_rank[sel], itemsize, SCRATCH, scr[sel], scr[sel] + size[sel], OUTPUT, doff[src, dest][sel])
        sel = np.flatnonzero(go & (s_of[dest] == (s_of[relay_rank] + k) % m))
        frm, to, lo, n, at = _joined(relay_rank[sel], dest[sel], scr[sel], size[sel], doff[src, dest][sel])
        b.transfers(frm, to, itemsize, SCRATCH, lo, lo + n, OUTPUT, at)
        steps.append(b.build())
    return steps


def _joined(frm, to, lo, n, at):
    """Consecutive transfers of one pair whose blocks follow each other on both sides, as one
    (a bundle whose blocks land in order: the usual rank-order layout)."""
    if len(frm) < 2:
        return frm, to, lo, n, at
    cont = (frm[1:] == frm[:-1]) & (to[1:] == to[:-1]) & (lo[1:] == lo[:-1] + n[:-1]) & (at[1:] == at[:-1] + n[:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~cont)))
    return frm[starts], to[starts], lo[starts], np.add.reduceat(n, starts), at[starts]


def allgather_blocks(srv: Servers, unit: int, l0: str, l1: str):
    """AllGather's hierarchy on blocks of their own lengths, as HCCL's AllGatherVMesh runs it:
    `gather(buf, offs)`, in place in buf, blocks end to end in rank order (bounds `offs`): level0
    inside each server (`l0`: the mesh on 910B, the ring on A3), then level1 among same-index cards
    over whole server regions (`l1`; pipeline: both levels at once)."""
    def gather(buf, offs):
        lo, hi = blocks(offs)           # bounds, or on one server (lo, hi) anywhere
        if l1 == "pipeline" and srv.m > 1:
            return pipeline.allgatherv(srv, (lo, hi), unit, buf)
        phases = []
        if srv.K > 1:
            progs = [tile(LEVEL0[l0].allgather(len(ranks), (lo[ranks], hi[ranks]), unit, buf), ranks[None, :])
                     for ranks in srv.ranks if len(ranks) > 1]
            phases.append(side_by_side(*progs))
        if srv.m > 1:
            groups = np.stack([srv.group(i) for i in range(srv.K)])
            regions = np.append(lo, hi[-1])[srv.start]
            phases.append(tile(_level1(l1, "allgather").allgather(srv.m, regions, unit, buf), groups))
        return sequence(*phases)
    return gather


def reducescatter_blocks(srv: Servers, unit: int, l0: str, l1: str):
    """ReduceScatter's hierarchy on blocks of their own lengths, as HCCL's
    ReduceScatterVMeshOpbase runs it (equal servers): `scatter(src, offs, acc, out, out_lo)`, blocks
    end to end in rank order (bounds `offs`): level1 among same-index cards reduces whole server
    regions into acc, then level0 inside each server reduces each rank's block into its output."""
    def scatter(src, offs, acc, out, out_lo):
        lo, hi = blocks(offs)           # bounds, or on one server (lo, hi) anywhere
        if l1 == "pipeline" and srv.m > 1:
            return pipeline.reducescatterv(srv, (lo, hi), unit, src, acc, out, out_lo)
        phases = []
        if srv.m > 1:
            groups = np.stack([srv.group(i) for i in range(srv.K)])
            first = srv.start[:-1]
            regions = np.append(lo, hi[-1])[srv.start]
            dst, dst_lo = (acc, regions[:-1]) if srv.K > 1 else (out, out_lo[first])
            phases.append(tile(_level1(l1, "reducescatter").reducescatter(srv.m, regions, unit, src, acc, dst, dst_lo),
                               groups))
        if srv.K > 1:
            level0_src = acc if srv.m > 1 else src
            progs = [tile(LEVEL0[l0].reducescatter(len(ranks), (lo[ranks], hi[ranks]), unit, level0_src, acc, out,
                                                   out_lo[ranks]), ranks[None, :]) for ranks in srv.ranks]
            phases.append(side_by_side(*progs))
        return sequence(*phases)
    return scatter
