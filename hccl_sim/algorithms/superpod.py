"""HCCL's three levels on an Atlas 900 A3 SuperPoD (DEV_TYPE_910_93; reference notes on A3 from
hcomm src/legacy/ascend910: topo_info_extractor.cc, the *_for_910_93 executors).

Ranks are dies. N0 dies per server (level0: a double ring, algorithms.double_ring), N1 servers per
(logical) superpod (level1: the same-index dies of its servers, over the UB fabric), N2 superpods
(level2: the same (server position, die) of every superpod, over RoCE). Superpods of unequal
server counts are cut into logical superpods of gcd(server counts) servers (HCCL's NHR-HCF); the
links between logical superpods stay what they are.

| op            | order (as the A3 executors run them)                                        |
| AllReduce     | L0 RS -> L1 RS -> L2 AllReduce -> L1 AG -> L0 AG (one superpod: L0 RS -> L1 AR -> L0 AG) |
| AllGather     | L2 AG -> L1 AG -> L0 AG (the slowest level moves the least)                  |
| ReduceScatter | L0 RS -> L1 RS -> L2 RS                                                      |
| Broadcast     | L0 scatter in the root's server -> L1 scatter in the root's superpod -> L2 Broadcast -> L1 AG -> L0 AG (one superpod: L0 scatter -> L1 Broadcast -> L0 AG) |
| Reduce        | L0 RS -> L1 RS -> L2 Reduce -> L1 gather -> L0 gather in the root's server (one superpod: L0 RS -> L1 Reduce -> L0 gather) |
| AlltoAll      | flat grouped full mesh (algorithms.grouped_mesh)                             |

Vector ops: die d owns chunk d of the N0 chunks; level1 splits it in N1 sub-chunks, level2 works
on one. Block ops (rows = ranks, pod-major, then server, then die): a level's peers hold rows N0
(level1) or N1 * N0 (level2) apart, so its sub-collective is `spread` over those rows; level0's
ring moves every N0-th row. A level's ranks move all the row sets they hold in each step, one set
after another (common.repeat_rows), so that the p(p-1) blocks of a SuperCluster are priced as its
levels' peer pairs. Each builder takes the double ring's `ring` (0 or 1) and is run by the
planner on that ring's half of the data.

The Ascend 950 runs the same levels with a full mesh at level0 (`l0="fullmesh"`: HCCL's Sequence
executors, level by level: mesh, NHR, NHR): the server's mesh ReduceScatter / AllGather (and
Scatter / Gather from the root) in place of the ring's, in rank order.

Deviation, stated: HCCL scatters at level1 with NHR or NB and gathers with a ring; here both are
the chain along the servers (double_ring.scatter / gather), the same bytes per link.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from . import double_ring, mesh, nhr, registry, ring
from .common import (INPUT, OUTPUT, SCRATCH, StepBuilder, bounds, relay_scatter, repeat_rows, sequence, side_by_side,
                     spread, tile)


class Pods:
    """The (N2, N1, N0) arrangement of ranks: logical superpod, server in it, die in the server."""

    def __init__(self, srv, pod_of_server):
        self.p, self.equal = srv.p, srv.equal
        if not srv.equal:           # HCCL's ARS executors (unequal die counts) are not modelled
            self.M, self.canonical, self.pod_of_rank = None, False, None
            self.N0 = self.N1 = self.N2 = self.physical = 0
            self.unequal = False
            return
        pod_of_server = np.asarray(pod_of_server, dtype=np.int64)
        pods = sorted(set(pod_of_server.tolist()), key=lambda k: int(np.flatnonzero(pod_of_server == k)[0]))
        members = [np.flatnonzero(pod_of_server == k) for k in pods]
        counts = [len(m) for m in members]
        self.physical = len(pods)
        self.unequal = len(set(counts)) > 1
        g = math.gcd(*counts) if counts else 1
        servers = np.concatenate(members) if members else np.zeros(0, dtype=np.int64)
        self.N0, self.N1 = srv.K, g
        self.N2 = len(servers) // g if g else 0
        self.M = np.stack([srv.ranks[s] for s in servers]).reshape(self.N2, self.N1, self.N0)
        # block collectives address output rows by rank: they need ranks pod-major, server, die
        self.canonical = bool(np.array_equal(self.M.reshape(-1), np.arange(self.p)))
        self.pod_of_rank = np.empty(self.p, dtype=np.int64)
        self.pod_of_rank[self.M.reshape(-1)] = np.repeat(np.arange(self.N2), self.N1 * self.N0)

    @property
    def shape(self):
        return self.N2, self.N1, self.N0

    def transposed(self) -> "Pods":
        """The same ranks with a superpod's servers and their ranks swapped: level0 the ranks of
        one index across the servers, level1 one server's ranks. How the 950's Parallel executor
        runs its second part, across servers first (hccl_sim.plan.loop_programs); for the vector
        collectives (rows of block ones follow the canonical layout)."""
        t = copy.copy(self)
        t.M = self.M.transpose(0, 2, 1)
        t.N0, t.N1 = self.N1, self.N0
        t.canonical = False
        return t

    def squeezed(self) -> "Pods":
        """The same ranks with every SuperPoD one level0 group (its N1 x N0 ranks) and level1 the
        same-index ranks of the SuperPoDs: how HCCL's TopoMatchSqueeze2D gives the 950's Parallel
        executors of three UBoE levels (docs/references.md §6.13) their two levels."""
        t = copy.copy(self)
        t.M = self.M.reshape(1, self.N2, self.N1 * self.N0)
        t.N0, t.N1, t.N2 = self.N1 * self.N0, self.N2, 1
        return t

    def where(self, rank: int):
        """(superpod, server, die) of a rank."""
        i, s, d = np.argwhere(self.M == rank)[0]
        return int(i), int(s), int(d)


def _module(name: str, collective: str):
    algo = registry.get(name)
    if collective not in algo.collectives:
        raise ValueError(f"{name} does not build {collective}")   # selection checked this
    return algo.module


def _kw(mod, oneshot):
    return {"oneshot": oneshot} if mod is nhr else {}


def _shifts(starts):
    return np.repeat(np.asarray(starts, dtype=np.int64)[:, None], 3, axis=1)


def _rows(program: list, q: int, strides) -> list:
    """A level's sub-collective on the q row sets each of its ranks holds (common.repeat_rows)."""
    return program if q == 1 else repeat_rows(program, q, strides)


def _by_length(ranks, lengths, starts, build) -> list:
    """A sub-collective per group (ranks[g], lengths[g] units from starts[g]), built once per length."""
    progs = []
    for length in np.unique(lengths):
        idx = np.flatnonzero(lengths == length)
        progs.append(tile(build(int(length)), ranks[idx], _shifts(starts[idx])))
    return side_by_side(*progs)


class _Chunks:
    """Vector layout: die d's chunk [lo[d], hi[d]); its level1 sub-chunks sub_lo[d, s] + [0, sub_len)."""

    def __init__(self, N, N0, N1):
        b = bounds(N, N0)
        self.lo, self.hi = b[:-1], b[1:]
        self.len = self.hi - self.lo
        sub = np.stack([bounds(int(c), N1) for c in self.len])              # (N0, N1 + 1)
        self.sub_lo, self.sub_len = sub[:, :-1], sub[:, 1:] - sub[:, :-1]


def _level0(l0, N0, ring_index, first=0):
    """(module, order of a server's ranks) of level0: the mesh in rank order (the 950), NHR (the
    950's Parallel part that crosses servers first: Pods.transposed), else the ring (A3), in its
    double ring's direction `ring_index`, from `first`."""
    if l0 in ("fullmesh", "NHR"):
        return (mesh if l0 == "fullmesh" else nhr), np.arange(N0)
    return ring, double_ring.order(N0, ring_index, first=first)


def _unit_blocks(mod, o):
    """A level0 module's view of one row per rank, in `o`'s order: NHR takes bounds, the others
    (lo, hi)."""
    return np.arange(len(o) + 1) if mod is nhr else (o, o + 1)


def _chunk_offs(mod, ch, o):
    """A level0 module's view of the chunks: NHR takes bounds, the others (lo, hi) in `o`'s order."""
    return np.append(ch.lo, ch.hi[-1]) if mod is nhr else (ch.lo[o], ch.hi[o])


def _level0_rs(pods, ch, unit, src, ring_index, l0):
    N2, N1, N0 = pods.shape
    mod, o = _level0(l0, N0, ring_index)
    prog = mod.reducescatter(N0, _chunk_offs(mod, ch, o), unit, src, OUTPUT, OUTPUT, ch.lo[o])
    return tile(prog, pods.M.reshape(-1, N0)[:, o])


def _level0_ag(pods, ch, unit, ring_index, l0):
    N2, N1, N0 = pods.shape
    mod, o = _level0(l0, N0, ring_index)
    return tile(mod.allgather(N0, _chunk_offs(mod, ch, o), unit, OUTPUT), pods.M.reshape(-1, N0)[:, o])


def _per_die(pods, pod=None):
    """Level1 groups (pod, die) -> (groups, N1) ranks, and each group's die."""
    M = pods.M if pod is None else pods.M[pod:pod + 1]
    groups = M.transpose(0, 2, 1).reshape(-1, pods.N1)
    return groups, np.tile(np.arange(pods.N0), M.shape[0])


def _per_position(pods):
    """Level2 groups (server position, die) -> (groups, N2) ranks, die and position of each."""
    groups = pods.M.transpose(1, 2, 0).reshape(-1, pods.N2)
    return groups, np.tile(np.arange(pods.N0), pods.N1), np.repeat(np.arange(pods.N1), pods.N0)


def _reduce_scatter_down(pods, ch, unit, l1, ring_index, l0):
    """(phases, where the data now is) of the reducing way down: level0 ReduceScatter (die d keeps
    chunk d) and, across superpods, level1 ReduceScatter of each chunk (server s keeps sub-chunk s)."""
    N2, N1, N0 = pods.shape
    phases, src = [], INPUT
    if N0 > 1:
        phases.append(_level0_rs(pods, ch, unit, INPUT, ring_index, l0))
        src = OUTPUT
    if N2 > 1 and N1 > 1:
        m1 = _module(l1, "reducescatter")
        groups, die = _per_die(pods)
        phases.append(_by_length(groups, ch.len[die], ch.lo[die], lambda n: m1.reducescatter(
            N1, bounds(n, N1), unit, src, OUTPUT, OUTPUT, bounds(n, N1)[:-1])))
        src = OUTPUT
    return phases, src


def _done(phases, N, unit) -> list:
    """The phases in order, or for one rank, the copy of its input."""
    if not phases:
        return [StepBuilder().copies([0], unit, INPUT, 0, N, OUTPUT, 0).build()] if N else []
    return sequence(*phases)


def allreduce(pods: Pods, N: int, unit: int, l1: str, l2: str, ring_index: int = 0, oneshot=None,
              l0: str = "ring") -> list:
    N2, N1, N0 = pods.shape
    ch = _Chunks(N, N0, N1)
    phases, src = _reduce_scatter_down(pods, ch, unit, l1, ring_index, l0)
    if N2 > 1:
        m2 = _module(l2, "allreduce")
        groups, die = _per_die(pods)
        pos_groups, d2, s2 = _per_position(pods)
        phases.append(_by_length(pos_groups, ch.sub_len[d2, s2], ch.lo[d2] + ch.sub_lo[d2, s2],
                                 lambda n, s=src: m2.allreduce(N2, n, unit, s, OUTPUT, **_kw(m2, oneshot))))
        if N1 > 1:
            ag = _module(l1, "allgather")
            phases.append(_by_length(groups, ch.len[die], ch.lo[die], lambda n: ag.allgather(N1, bounds(n, N1), unit, OUTPUT)))
    elif N1 > 1:
        m1 = _module(l1, "allreduce")
        groups, die = _per_die(pods)
        phases.append(_by_length(groups, ch.len[die], ch.lo[die],
                                 lambda n, s=src: m1.allreduce(N1, n, unit, s, OUTPUT, **_kw(m1, oneshot))))
    if N0 > 1:
        phases.append(_level0_ag(pods, ch, unit, ring_index, l0))
    return _done(phases, N, unit)


def allgather(pods: Pods, unit: int, l1: str, l2: str, ring_index: int = 0, l0: str = "ring") -> list:
    """Rows: the block of the rank at position q of pods.M is output row q (its rank id where
    pods.canonical)."""
    N2, N1, N0 = pods.shape
    M = pods.M
    r = np.arange(pods.p)
    # row q belongs to the rank at position q of M (its rank id on the canonical layout; a
    # transposed view's rows are renumbered to ranks after: common.relabel_rows)
    phases = [[StepBuilder().copies(M.reshape(-1), unit, INPUT, 0, 1, OUTPUT, r).build()]]
    if N2 > 1:
        prog = spread(_module(l2, "allgather").allgather(N2, np.arange(N2 + 1), unit, OUTPUT), (1, N1 * N0, 1))
        groups = M.transpose(1, 2, 0).reshape(-1, N2)
        phases.append(tile(prog, groups, _shifts(np.arange(N1 * N0))))
    if N1 > 1:
        prog = spread(_module(l1, "allgather").allgather(N1, np.arange(N1 + 1), unit, OUTPUT), (1, N0, 1))
        # group (pod i, die d) moves the N1 servers' rows j * N1 * N0 + s * N0 + d of every pod j
        prog = _rows(prog, N2, [N1 * N0] * 3)
        phases.append(tile(prog, M.transpose(0, 2, 1).reshape(-1, N1), _shifts(np.tile(np.arange(N0), N2))))
    if N0 > 1:
        mod, o = _level0(l0, N0, ring_index)
        # a server's dies move rows i * N0 + d of every server i
        prog = _rows(mod.allgather(N0, _unit_blocks(mod, o), unit, OUTPUT), N1 * N2, [N0] * 3)
        phases.append(tile(prog, M.reshape(-1, N0)[:, o]))
    return sequence(*phases)


def reducescatter(pods: Pods, unit: int, l1: str, l2: str, ring_index: int = 0, l0: str = "ring") -> list:
    """Rows: input and scratch hold p blocks, row q that of the rank at position q of pods.M (its
    rank id where pods.canonical); output one."""
    N2, N1, N0 = pods.shape
    M = pods.M
    phases, src = [], INPUT

    def shifts(starts):
        sh = _shifts(starts)
        sh[:, OUTPUT] = 0
        return sh
    if N0 > 1:
        mod, o = _level0(l0, N0, ring_index)
        last = N1 == 1 and N2 == 1
        q = N1 * N2
        prog = mod.reducescatter(N0, _unit_blocks(mod, o), unit, src, SCRATCH, OUTPUT if last else SCRATCH,
                                 np.zeros(N0, dtype=np.int64) if last else o)
        phases.append(tile(_rows(prog, q, [N0, 0, N0]), M.reshape(-1, N0)[:, o]))
        src = SCRATCH
    if N1 > 1:
        last = N2 == 1
        mod = _module(l1, "reducescatter")
        prog = spread(mod.reducescatter(N1, np.arange(N1 + 1), unit, src, SCRATCH, OUTPUT if last else SCRATCH,
                                        np.zeros(N1, dtype=np.int64) if last else np.arange(N1)), (N0, 1, N0))
        prog = _rows(prog, N2, [N1 * N0, 0, N1 * N0])
        phases.append(tile(prog, M.transpose(0, 2, 1).reshape(-1, N1), shifts(np.tile(np.arange(N0), N2))))
        src = SCRATCH
    if N2 > 1:
        mod = _module(l2, "reducescatter")
        prog = spread(mod.reducescatter(N2, np.arange(N2 + 1), unit, src, SCRATCH, OUTPUT, np.zeros(N2, dtype=np.int64)),
                      (N1 * N0, 1, N1 * N0))
        phases.append(tile(prog, M.transpose(1, 2, 0).reshape(-1, N2), shifts(np.arange(N1 * N0))))
    return _done(phases, 1, unit)


def broadcast(pods: Pods, N: int, unit: int, root: int, l1: str, l2: str, ring_index: int = 0, oneshot=None,
              l0: str = "ring") -> list:
    N2, N1, N0 = pods.shape
    M = pods.M
    i0, s0, d0 = pods.where(root)
    ch = _Chunks(N, N0, N1)
    phases, src = [], INPUT
    if N0 > 1:
        if l0 == "fullmesh":        # the root writes each rank of its server its chunk
            phases.append(tile(mesh.scatter(N0, bounds(N, N0), unit, d0, INPUT, OUTPUT), M[i0, s0][None, :]))
        elif l0 == "NHR":           # the 950's Parallel part across servers first: NHR's scatter in the root's column
            offs = np.append(ch.lo, ch.hi[-1])
            phases.append(tile(relay_scatter(nhr.scatter_rounds(N0, d0), offs, unit, d0, INPUT, OUTPUT, OUTPUT,
                                             ch.lo), M[i0, s0][None, :]))
        else:
            o = double_ring.order(N0, ring_index, first=d0)
            phases.append(tile(double_ring.scatter(N0, (ch.lo[o], ch.hi[o]), unit, INPUT, OUTPUT),
                               M[i0, s0, o][None, :]))
        src = OUTPUT
    if N2 > 1:
        groups, die = _per_die(pods, i0)
        if N1 > 1:
            o1 = double_ring.order(N1, 0, first=s0)
            phases.append(side_by_side(*[tile(double_ring.scatter(
                N1, (ch.sub_lo[d][o1], ch.sub_lo[d][o1] + ch.sub_len[d][o1]), unit, src, OUTPUT),
                groups[d][o1][None, :], _shifts([ch.lo[d]])) for d in range(N0)]))
            src = OUTPUT
        m2 = _module(l2, "broadcast")
        pos_groups, d2, s2 = _per_position(pods)
        phases.append(_by_length(pos_groups, ch.sub_len[d2, s2], ch.lo[d2] + ch.sub_lo[d2, s2],
                                 lambda n, s=src: m2.broadcast(N2, n, unit, i0, s, OUTPUT, **_kw(m2, oneshot))))
        if N1 > 1:
            ag = _module(l1, "allgather")
            all_groups, all_die = _per_die(pods)
            phases.append(_by_length(all_groups, ch.len[all_die], ch.lo[all_die],
                                     lambda n: ag.allgather(N1, bounds(n, N1), unit, OUTPUT)))
    elif N1 > 1:
        m1 = _module(l1, "broadcast")
        groups, die = _per_die(pods)
        phases.append(_by_length(groups, ch.len[die], ch.lo[die],
                                 lambda n, s=src: m1.broadcast(N1, n, unit, s0, s, OUTPUT, **_kw(m1, oneshot))))
    if N0 > 1:
        phases.append(_level0_ag(pods, ch, unit, ring_index, l0))
    return _done(phases, N, unit)


def reduce(pods: Pods, N: int, unit: int, root: int, l1: str, l2: str, ring_index: int = 0,
           l0: str = "ring") -> list:
    N2, N1, N0 = pods.shape
    M = pods.M
    i0, s0, d0 = pods.where(root)
    ch = _Chunks(N, N0, N1)
    phases, src = _reduce_scatter_down(pods, ch, unit, l1, ring_index, l0)
    if N2 > 1:
        m2 = _module(l2, "reduce")
        pos_groups, d2, s2 = _per_position(pods)
        phases.append(_by_length(pos_groups, ch.sub_len[d2, s2], ch.lo[d2] + ch.sub_lo[d2, s2],
                                 lambda n, s=src: m2.reduce(N2, n, unit, i0, s, OUTPUT)))
        if N1 > 1:
            root_groups, _ = _per_die(pods, i0)
            o1 = double_ring.order(N1, 0, first=s0)
            phases.append(side_by_side(*[tile(double_ring.gather(
                N1, (ch.sub_lo[d][o1], ch.sub_lo[d][o1] + ch.sub_len[d][o1]), unit, OUTPUT),
                root_groups[d][o1][None, :], _shifts([ch.lo[d]])) for d in range(N0)]))
    elif N1 > 1:
        m1 = _module(l1, "reduce")
        groups, die = _per_die(pods)
        phases.append(_by_length(groups, ch.len[die], ch.lo[die],
                                 lambda n, s=src: m1.reduce(N1, n, unit, s0, s, OUTPUT)))
    if N0 > 1:
        if l0 == "fullmesh":        # each rank of the root's server writes its chunk to the root
            phases.append(tile(mesh.gather(N0, bounds(N, N0), unit, d0, OUTPUT), M[i0, s0][None, :]))
        else:
            o = double_ring.order(N0, ring_index, first=d0)
            phases.append(tile(double_ring.gather(N0, (ch.lo[o], ch.hi[o]), unit, OUTPUT), M[i0, s0, o][None, :]))
    return _done(phases, N, unit)
