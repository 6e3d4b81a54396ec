"""H-D_R: recursive halving-doubling with HCCL's non-power-of-two fold (HCCL RHD.md;
hcomm recursive_halvingdoubling_base.cc, all_reduce_recursive_hd.cc).

Fold: block = 2^floor(log2 p), rem = p - block. Among the first 2*rem ranks each odd rank sends
its whole buffer to rank-1 (which reduces it, or for AllGather keeps its block) and idles; the
remaining `block` ranks run the power-of-two algorithm as virtual ranks; at the end each even
rank of a pair sends the result back to its odd partner.

- AllReduce: ReduceScatter by recursive halving (partner at distance block/2, block/4, ..., 1;
  send half of the current range, reduce the kept half), then AllGather by recursive doubling
  (distance 1, 2, ..., block/2). Power of two: 2 log p a + 2(p-1)/p nb + (p-1)/p ng.
  Otherwise (2 floor(log p) + 2) a + (2(p'-1)/p' + 2) nb + ((p'-1)/p' + 1) ng, p' = block.
- ReduceScatter (rank blocks, partials in scratch): the fold's reduce, halving over virtual
  ranks whose ranges are contiguous runs of real blocks (a virtual rank of a pair owns both of its
  blocks), and the even rank hands the odd partner its block. Power of two:
  log p a + (p-1)/p n(b+g), n = whole input.
- AllGather: the odd rank gives its block to its partner, doubling over virtual ranks, and the
  even rank sends the whole output back. Power of two: log p a + (p-1)/p nb, n = whole output.
Zero-copy safety: each exchange writes the half a rank keeps and exposes the half it gives away.
"""
from __future__ import annotations

from hcomm.steps import Copy, Recv, Send

from .common import INPUT, OUTPUT, SCRATCH, bounds, first_block, fold, local_copy, real_rank, sl, virtual_rank

NAME = "H-D_R"
COLLECTIVES = ("allreduce", "reducescatter", "allgather")


def _halve(v: int, d: int, lo: int, hi: int):
    """Halving step at distance d: ((kept lo, hi), (given lo, hi)); the d bit of v picks the upper half."""
    mid = (lo + hi) // 2
    return ((mid, hi), (lo, mid)) if v & d else ((lo, mid), (mid, hi))


def _sibling(v: int, d: int, lo: int, hi: int):
    """Doubling step at distance d: the partner's range, adjacent to ours and as long."""
    return (lo - (hi - lo), lo) if v & d else (hi, hi + (hi - lo))


def allreduce(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    if p == 1 or n == 0:
        return local_copy(n, unit)
    block, rem = fold(p)
    v = virtual_rank(rank, rem)
    whole = n * unit
    if v is None:   # odd rank of a pair: hand over, then receive the result
        return [(Send(rank - 1, sl(INPUT, 0, n), whole),), (Recv(rank - 1, sl(OUTPUT, 0, n), whole),)]
    steps = []
    cur = INPUT
    if rank < 2 * rem:
        steps.append((Recv(rank + 1, sl(OUTPUT, 0, n), whole, reduce_with=sl(INPUT, 0, n)),))
        cur = OUTPUT
    b = bounds(n, block)
    lo, hi = 0, block
    d = block >> 1
    while d:
        peer = real_rank(v ^ d, rem)
        (klo, khi), (slo, shi) = _halve(v, d, lo, hi)
        steps.append((Send(peer, sl(cur, b[slo], b[shi]), (b[shi] - b[slo]) * unit),
                      Recv(peer, sl(OUTPUT, b[klo], b[khi]), (b[khi] - b[klo]) * unit,
                           reduce_with=sl(cur, b[klo], b[khi]))))
        lo, hi, cur = klo, khi, OUTPUT
        d >>= 1
    d = 1
    while d < block:
        peer = real_rank(v ^ d, rem)
        plo, phi = _sibling(v, d, lo, hi)
        steps.append((Send(peer, sl(OUTPUT, b[lo], b[hi]), (b[hi] - b[lo]) * unit),
                      Recv(peer, sl(OUTPUT, b[plo], b[phi]), (b[phi] - b[plo]) * unit)))
        lo, hi = min(lo, plo), max(hi, phi)
        d <<= 1
    if rank < 2 * rem:
        steps.append((Send(rank + 1, sl(OUTPUT, 0, n), whole),))
    return steps


def reducescatter(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    """Blocks: input and scratch hold p rows of `unit` bytes, output one row."""
    if p == 1:
        return [(Copy(sl(INPUT, 0, 1), sl(OUTPUT, 0, 1), unit),)]
    block, rem = fold(p)
    v = virtual_rank(rank, rem)
    if v is None:
        return [(Send(rank - 1, sl(INPUT, 0, p), p * unit),), (Recv(rank - 1, sl(OUTPUT, 0, 1), unit),)]
    steps = []
    cur = INPUT
    if rank < 2 * rem:
        steps.append((Recv(rank + 1, sl(SCRATCH, 0, p), p * unit, reduce_with=sl(INPUT, 0, p)),))
        cur = SCRATCH
    start = [first_block(u, rem) for u in range(block)] + [p]
    lo, hi = 0, block
    d = block >> 1
    while d:
        peer = real_rank(v ^ d, rem)
        (klo, khi), (slo, shi) = _halve(v, d, lo, hi)
        kb0, kb1 = start[klo], start[khi]
        last_single = d == 1 and kb1 - kb0 == 1
        dst = sl(OUTPUT, 0, 1) if last_single else sl(SCRATCH, kb0, kb1)
        steps.append((Send(peer, sl(cur, start[slo], start[shi]), (start[shi] - start[slo]) * unit),
                      Recv(peer, dst, (kb1 - kb0) * unit, reduce_with=sl(cur, kb0, kb1))))
        lo, hi, cur = klo, khi, SCRATCH
        d >>= 1
    if rank < 2 * rem:
        steps.append((Copy(sl(SCRATCH, rank, rank + 1), sl(OUTPUT, 0, 1), unit),
                      Send(rank + 1, sl(SCRATCH, rank + 1, rank + 2), unit)))
    return steps


def allgather(rank: int, p: int, n: int, unit: int, root: int = 0) -> list:
    """Blocks: input holds one row of `unit` bytes, output p rows."""
    own = Copy(sl(INPUT, 0, 1), sl(OUTPUT, rank, rank + 1), unit)
    if p == 1:
        return [(own,)]
    block, rem = fold(p)
    v = virtual_rank(rank, rem)
    if v is None:
        return [(Send(rank - 1, sl(INPUT, 0, 1), unit), own), (Recv(rank - 1, sl(OUTPUT, 0, p), p * unit),)]
    steps = []
    if rank < 2 * rem:
        steps.append((own, Recv(rank + 1, sl(OUTPUT, rank + 1, rank + 2), unit)))
    start = [first_block(u, rem) for u in range(block)] + [p]
    lo, hi = v, v + 1
    d = 1
    while d < block:
        peer = real_rank(v ^ d, rem)
        plo, phi = _sibling(v, d, lo, hi)
        first = not steps
        src = sl(INPUT, 0, 1) if first else sl(OUTPUT, start[lo], start[hi])
        step = (Send(peer, src, (start[hi] - start[lo]) * unit),
                Recv(peer, sl(OUTPUT, start[plo], start[phi]), (start[phi] - start[plo]) * unit))
        steps.append(step + (own,) if first else step)
        lo, hi = min(lo, plo), max(hi, phi)
        d <<= 1
    if rank < 2 * rem:
        steps.append((Send(rank + 1, sl(OUTPUT, 0, p), p * unit),))
    return steps
