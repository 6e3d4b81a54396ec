"""Full mesh (HCCL Mesh.md; level0 on 910B, `fullmesh`): every rank exchanges with all peers at
once, over its HCCS links (which share the NPU's HCCS port on the 910B preset).

- ReduceScatter: one step; each rank copies its own contribution into place and every peer's
  share for it is reduced in: a + n/p b + (p-1)/p n g (transfers concurrent, reductions serial).
- AllGather (in place): one step, every rank's block to every peer: a + n/p b.
- AllReduce = ReduceScatter + AllGather: 2a + 2n/p b + (p-1)/p n g.
- Broadcast = Scatter (root -> each rank its chunk) + AllGather; Reduce = ReduceScatter + Gather.
Blocks may be owned several per rank (`owner`), which is how unequal servers split a vector.
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder, blocks, bounds, local_copy

NAME = "fullmesh"
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "scatter")
LEVELS = ("flat", "level0")
DESCRIPTION = "every rank exchanges with all peers at once"


def round_robin(a, b, n):
    """Order pairs as HCCL's mesh issues them: every rank's transfer to its next peer first,
    then to the one after (distance 1, 2, ..., n-1), so each round is a permutation."""
    order = np.lexsort((a, (b - a) % n))
    return order


def _owned(n, nblocks, owner):
    """Per (sender, block) pairs where the block's owner is another rank, in round-robin order."""
    owner = np.arange(nblocks) % n if owner is None else np.asarray(owner, dtype=np.int64)
    s, blk = np.divmod(np.arange(n * nblocks), nblocks)
    keep = s != owner[blk]
    s, blk = s[keep], blk[keep]
    o = round_robin(s, owner[blk], n)
    return s[o], blk[o], owner


def reducescatter(n: int, offs, unit: int, src=INPUT, acc=SCRATCH, out=OUTPUT, out_lo=None, owner=None) -> list:
    """Block b of src (`offs`: bounds, or (lo, hi) per block) is reduced at rank owner[b]
    (default b), into out[out_lo[b]]."""
    lo, hi = blocks(offs)
    nblocks = len(lo)
    out_lo = lo if out_lo is None and owner is not None else (
        np.zeros(n, dtype=np.int64) if out_lo is None else np.asarray(out_lo, dtype=np.int64))
    s, blk, owner = _owned(n, nblocks, owner)
    b = StepBuilder()
    own = np.arange(nblocks)
    move = ~((src == out) & (lo == out_lo[own]))
    b.copies(owner[own][move], unit, src, lo[own][move], hi[own][move], out, out_lo[own][move])
    if n > 1:
        b.transfers(s, owner[blk], unit, src, lo[blk], hi[blk], out, out_lo[blk], rbuf=out, rlo=out_lo[blk])
    return [] if b.empty() else [b.build()]


def allgather(n: int, offs, unit: int, buf=OUTPUT, owner=None) -> list:
    """In place: block b (`offs`: bounds, or (lo, hi) per block), already at its owner (default
    rank b), goes to every other rank."""
    lo, hi = blocks(offs)
    nblocks = len(lo)
    owner = np.arange(nblocks) % n if owner is None else np.asarray(owner, dtype=np.int64)
    if n == 1:
        return []
    blk, dst = np.divmod(np.arange(nblocks * n), n)
    keep = dst != owner[blk]
    blk, dst = blk[keep], dst[keep]
    o = round_robin(owner[blk], dst, n)
    blk, dst = blk[o], dst[o]
    return [StepBuilder().transfers(owner[blk], dst, unit, buf, lo[blk], hi[blk], buf, lo[blk]).build()]


def scatter(n: int, offs, unit: int, root: int, src=INPUT, dst=OUTPUT, owner=None) -> list:
    """The root sends block b of src to its owner's dst (same rows); it copies src to dst itself."""
    offs = np.asarray(offs, dtype=np.int64)
    blocks = len(offs) - 1
    owner = np.arange(blocks) % n if owner is None else np.asarray(owner, dtype=np.int64)
    blk = np.flatnonzero(owner != root)
    b = StepBuilder().transfers(np.full(len(blk), root), owner[blk], unit, src, offs[blk], offs[blk + 1], dst, offs[blk])
    if src != dst:
        b.copies([root], unit, src, offs[0], offs[-1], dst, offs[0])
    return [] if b.empty() else [b.build()]


def gather(n: int, offs, unit: int, root: int, buf=OUTPUT, owner=None) -> list:
    """Every owner sends its block of buf to the root (same rows)."""
    offs = np.asarray(offs, dtype=np.int64)
    blocks = len(offs) - 1
    owner = np.arange(blocks) % n if owner is None else np.asarray(owner, dtype=np.int64)
    blk = np.flatnonzero(owner != root)
    if not len(blk):
        return []
    return [StepBuilder().transfers(owner[blk], np.full(len(blk), root), unit, buf, offs[blk], offs[blk + 1], buf,
                                    offs[blk]).build()]


def allreduce(n: int, N: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    b = bounds(N, n)
    return reducescatter(n, b, unit, src, dst, dst, b[:-1]) + allgather(n, b, unit, dst)


def broadcast(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    b = bounds(N, n)
    owner = np.arange(n)
    ag = StepBuilder()
    blk, to = np.divmod(np.arange(n * n), n)
    keep = (to != blk) & (to != root)          # the root holds everything already
    blk, to = blk[keep], to[keep]
    o = round_robin(blk, to, n)
    blk, to = blk[o], to[o]
    ag.transfers(blk, to, unit, dst, b[blk], b[blk + 1], dst, b[blk])
    return scatter(n, b, unit, root, src, dst, owner) + [ag.build()]


def reduce(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    b = bounds(N, n)
    return reducescatter(n, b, unit, src, dst, dst, b[:-1]) + gather(n, b, unit, root, dst)


def alltoall(n: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    """One step: block j of every rank's src goes straight to rank j (own block copied locally)."""
    r = np.arange(n)
    i, j = np.divmod(np.arange(n * n), n)
    keep = i != j
    i, j = i[keep], j[keep]
    o = round_robin(i, j, n)
    i, j = i[o], j[o]
    b = StepBuilder().copies(r, unit, src, r, r + 1, dst, r)
    b.transfers(i, j, unit, src, j, j + 1, dst, i)
    return [b.build()]


def alltoallv(blocks, itemsize: int, src=INPUT, dst=OUTPUT) -> list:
    """AlltoAllV in one step: every rank's block for rank j goes straight to j, each of its own
    length, in the mesh's issue order (own block copied locally; empty blocks move nothing).
    `blocks`: (lengths, send offsets, receive offsets), each [sender, receiver], in elements."""
    lengths, soff, doff = blocks
    n = len(lengths)
    r = np.arange(n)
    i, j = np.divmod(np.arange(n * n), n)
    keep = (i != j) & (lengths[i, j] > 0)
    i, j = i[keep], j[keep]
    o = round_robin(i, j, n)
    i, j = i[o], j[o]
    own = lengths[r, r] > 0
    b = StepBuilder().copies(r[own], itemsize, src, soff[r, r][own], (soff[r, r] + lengths[r, r])[own], dst,
                             doff[r, r][own])
    b.transfers(i, j, itemsize, src, soff[i, j], soff[i, j] + lengths[i, j], dst, doff[i, j])
    return [b.build()]


def scatter_rounds(n: int, root: int) -> list:
    """Scatter (HCCL scatter_mesh.cc): one step, the root writing every rank's block to it."""
    others = np.array([b for b in range(n) if b != root], dtype=np.int64)
    return [(np.full(len(others), root), others, others)] if len(others) else []
