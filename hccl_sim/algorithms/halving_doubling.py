"""H-D_R: recursive halving-doubling with HCCL's non-power-of-two fold (HCCL RHD.md;
hcomm recursive_halvingdoubling_base.cc, all_reduce_recursive_hd.cc). Vectorised over ranks.

Fold: block = 2^floor(log2 p), rem = p - block. Among the first 2*rem ranks each odd rank sends
its whole buffer to rank-1 (which reduces it, or for AllGather keeps its block) and idles; the
remaining `block` ranks run the power-of-two algorithm as virtual ranks; at the end each even
rank of a pair sends the result back to its odd partner.

- AllReduce: ReduceScatter by recursive halving (partner at distance block/2, ..., 1; send half
  of the current range, reduce the kept half), then AllGather by recursive doubling.
  Power of two: 2 log p a + 2(p-1)/p nb + (p-1)/p ng. Otherwise
  (2 floor(log p) + 2) a + (2(p'-1)/p' + 2) nb + ((p'-1)/p' + 1) ng, p' = block.
- ReduceScatter: the fold's reduce, halving over virtual ranks whose ranges are contiguous runs
  of rank blocks (a folded pair's virtual rank owns both blocks), and the even rank hands its
  partner its block. Power of two: log p a + (p-1)/p n(b+g), n = whole input.
- AllGather (in place): the odd rank gives its block to its partner, doubling over virtual ranks,
  and the even rank sends the whole buffer back. Power of two: log p a + (p-1)/p nb.
- Broadcast / Reduce: binomial trees over ranks relative to the root, the whole buffer per step:
  ceil(log p)(a + nb) and ceil(log p)(a + nb + ng), as HCCL's RHD Broadcast formula.
Zero-copy safety: each exchange writes the half a rank keeps and exposes the half it gives away.
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder, bounds, relay_broadcast, single_rank_reducescatter, ceil_log2, fold, local_copy

NAME = "H-D_R"
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce")
LEVELS = ("flat", "level1")
DESCRIPTION = "recursive halving-doubling with HCCL's non-power-of-two fold"


def _real(v, rem):
    return np.where(v < rem, 2 * v, v + rem)


def _halve(v, d, lo, hi):
    """Halving at distance d: (kept lo, hi, given lo, hi); the d bit of v picks the upper half."""
    mid = (lo + hi) // 2
    upper = (v & d) != 0
    return np.where(upper, mid, lo), np.where(upper, hi, mid), np.where(upper, lo, mid), np.where(upper, mid, hi)


def _sibling(v, d, lo, hi):
    """Doubling at distance d: the partner's range, adjacent to ours and as long."""
    upper = (v & d) != 0
    length = hi - lo
    return np.where(upper, lo - length, hi), np.where(upper, lo, hi + length)


def allreduce(n: int, N: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    block, rem = fold(n)
    odd = np.arange(1, 2 * rem, 2)
    steps = []
    if rem:
        steps.append(StepBuilder().transfers(odd, odd - 1, unit, src, 0, N, dst, 0, rbuf=src, rlo=0).build())
    v = np.arange(block)
    real = _real(v, rem)
    cur = np.where(v < rem, dst, src)
    b = bounds(N, block)
    lo, hi = np.zeros(block, dtype=np.int64), np.full(block, block, dtype=np.int64)
    d = block >> 1
    while d:
        klo, khi, slo, shi = _halve(v, d, lo, hi)
        partner = v ^ d
        steps.append(StepBuilder().transfers(real, real[partner], unit, cur, b[slo], b[shi], dst, b[slo],
                                             rbuf=cur[partner], rlo=b[slo]).build())
        lo, hi, cur = klo, khi, np.full(block, dst)
        d >>= 1
    d = 1
    while d < block:
        plo, phi = _sibling(v, d, lo, hi)
        steps.append(StepBuilder().transfers(real, real[v ^ d], unit, dst, b[lo], b[hi], dst, b[lo]).build())
        lo, hi = np.minimum(lo, plo), np.maximum(hi, phi)
        d <<= 1
    if rem:
        steps.append(StepBuilder().transfers(odd - 1, odd, unit, dst, 0, N, dst, 0).build())
    return steps


def reducescatter(n: int, offs, unit: int, src=INPUT, acc=SCRATCH, out=OUTPUT, out_lo=None) -> list:
    offs = np.asarray(offs, dtype=np.int64)
    out_lo = np.zeros(n, dtype=np.int64) if out_lo is None else np.asarray(out_lo, dtype=np.int64)
    if n == 1:
        return single_rank_reducescatter(offs, unit, src, out, out_lo)
    block, rem = fold(n)
    odd = np.arange(1, 2 * rem, 2)
    steps = []
    if rem:
        steps.append(StepBuilder().transfers(odd, odd - 1, unit, src, offs[0], offs[n], acc, offs[0],
                                             rbuf=src, rlo=offs[0]).build())
    v = np.arange(block)
    real = _real(v, rem)
    start = offs[np.append(_real(v, rem), n)]           # first row of each virtual rank's blocks
    cur = np.where(v < rem, acc, src)
    lo, hi = np.zeros(block, dtype=np.int64), np.full(block, block, dtype=np.int64)
    d = block >> 1
    while d:
        klo, khi, slo, shi = _halve(v, d, lo, hi)
        partner = v ^ d
        single = (d == 1) & (partner >= rem)             # the receiver's last kept range is its own block
        preal = real[partner]
        dbuf = np.where(single, out, acc)
        dlo = np.where(single, out_lo[preal], start[slo])
        steps.append(StepBuilder().transfers(real, preal, unit, cur, start[slo], start[shi], dbuf, dlo,
                                             rbuf=cur[partner], rlo=start[slo]).build())
        lo, hi, cur = klo, khi, np.full(block, acc)
        d >>= 1
    if rem:
        even = odd - 1
        steps.append(StepBuilder()
                     .copies(even, unit, acc, offs[even], offs[even + 1], out, out_lo[even])
                     .transfers(even, odd, unit, acc, offs[odd], offs[odd + 1], out, out_lo[odd]).build())
    return steps


def allgather(n: int, offs, unit: int, buf=OUTPUT) -> list:
    offs = np.asarray(offs, dtype=np.int64)
    if n == 1:
        return []
    block, rem = fold(n)
    odd = np.arange(1, 2 * rem, 2)
    steps = []
    if rem:
        steps.append(StepBuilder().transfers(odd, odd - 1, unit, buf, offs[odd], offs[odd + 1], buf, offs[odd]).build())
    v = np.arange(block)
    real = _real(v, rem)
    start = offs[np.append(real, n)]
    lo, hi = v.copy(), v + 1
    d = 1
    while d < block:
        plo, phi = _sibling(v, d, lo, hi)
        steps.append(StepBuilder().transfers(real, real[v ^ d], unit, buf, start[lo], start[hi], buf, start[lo]).build())
        lo, hi = np.minimum(lo, plo), np.maximum(hi, phi)
        d <<= 1
    if rem:
        steps.append(StepBuilder().transfers(odd - 1, odd, unit, buf, offs[0], offs[n], buf, offs[0]).build())
    return steps


def broadcast(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    """Binomial tree from the root: in step k, relative ranks below 2^k send to rel + 2^k."""
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    rounds = []
    for k in range(ceil_log2(n)):
        rel = np.arange(min(1 << k, n - (1 << k)))
        rounds.append(((rel + root) % n, (rel + (1 << k) + root) % n))
    return relay_broadcast(rounds, N, unit, root, src, dst)


def reduce(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    """Binomial tree into the root: in step k, relative ranks = 2^k mod 2^(k+1) send to rel - 2^k."""
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    has_partial = np.zeros(n, dtype=bool)
    steps = []
    for k in range(ceil_log2(n)):
        rel = np.arange(1 << k, n, 1 << (k + 1))
        senders, receivers = (rel + root) % n, (rel - (1 << k) + root) % n
        steps.append(StepBuilder().transfers(senders, receivers, unit, np.where(has_partial[rel], dst, src), 0, N,
                                             dst, 0, rbuf=np.where(has_partial[rel - (1 << k)], dst, src),
                                             rlo=0).build())
        has_partial[rel - (1 << k)] = True
    return steps
