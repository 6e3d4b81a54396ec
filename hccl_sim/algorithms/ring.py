"""Ring: every rank sends to its right neighbour and receives from its left (HCCL Ring.md).

Schedules (p ranks, n bytes of buffer, chunk = n/p), vectorised over ranks:
- AllReduce = ring ReduceScatter (p-1 steps: send a partial chunk right, reduce the chunk from
  the left with one's own contribution) + ring AllGather (p-1 steps forwarding reduced chunks).
  Bytes per rank on the wire: 2(p-1)/p n. Cost 2(p-1)a + 2(p-1)/p nb + (p-1)/p ng.
- ReduceScatter: p-1 steps on rank blocks, partials in an accumulator buffer, the last step
  reducing into the result's place. Cost (p-1)a + (p-1)/p n(b+g), n = whole input.
- AllGather (in place: each rank's block already in the buffer): p-1 steps forwarding blocks.
  Cost (p-1)a + (p-1)/p nb, n = whole output.
- Broadcast: a chain from the root, each rank forwarding the whole buffer. Cost (p-1)(a + nb).
- Reduce: a chain ending at the root, each rank reducing and forwarding. Cost (p-1)(a + nb + ng).
Any p works; uneven chunks (n not divisible by p) differ by one unit. Blocks of ReduceScatter and
AllGather may differ in size (`offs`), which is how the hierarchy runs them on server regions,
and may be given per rank as (lo, hi) in any order, which is how A3's reversed ring owns them.
Zero-copy safety: in every step the slice a rank writes differs from the slice it exposes.
"""
from __future__ import annotations

import numpy as np

from hcomm.program import LazyStep, RolledView

from .common import (INPUT, OUTPUT, SCRATCH, StepBuilder, blocks, bounds, local_copy, relay_broadcast,
                     single_rank_reducescatter)

_EAGER_TRANSFERS = 1 << 15   # larger ring programs are built step by step on demand


def _ring_steps(count, n, full, sizes, shift, reduce, tag):
    """`count` ring steps; step s moves chunk sizes rolled by shift(s) from each rank to its right.

    Steps with equal byte patterns share a timing key, so a uniform ring is priced once."""
    r = np.arange(n)
    right = (r + 1) % n
    uniform = len(sizes) and sizes.min() == sizes.max()
    rflag = np.full(n, 1 if reduce else -1, dtype=np.int64)

    def key(s):
        return ("ring", tag, n, int(sizes[0]), reduce) if uniform else None

    def timing(s):
        return RolledView(r, right, sizes, shift(s), rflag)
    skey = ("ring-structure", n, reduce)
    if count * n <= _EAGER_TRANSFERS:
        out = []
        for s in range(count):
            st = full(s)
            st.tkey, st.skey = key(s), skey
            out.append(st)
        return out
    return [LazyStep(lambda s=s: full(s), lambda s=s: timing(s), key(s), skey) for s in range(count)]

NAME = "ring"
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "scatter")
LEVELS = ("flat", "level0", "level1")
NOT_AT = {"level1": ("broadcast",)}    # HCCL: ring does not run inter-server Broadcast (falls back to H-D_R)
DESCRIPTION = "each rank sends to its right neighbour, receives from its left"


def allreduce(n: int, N: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    b = bounds(N, n)
    sizes = (b[1:] - b[:-1]) * unit
    r = np.arange(n)
    right = (r + 1) % n

    def rs(s):
        c = (r - s) % n
        return StepBuilder().transfers(r, right, unit, src if s == 0 else dst, b[c], b[c + 1], dst, b[c],
                                       rbuf=src, rlo=b[c]).build()

    def ag(s):
        c = (r + 1 - s) % n
        return StepBuilder().transfers(r, right, unit, dst, b[c], b[c + 1], dst, b[c]).build()
    return (_ring_steps(n - 1, n, rs, sizes, lambda s: s, True, "ar-rs")
            + _ring_steps(n - 1, n, ag, sizes, lambda s: s - 1, False, "ar-ag"))


def reducescatter(n: int, offs, unit: int, src=INPUT, acc=SCRATCH, out=OUTPUT, out_lo=None) -> list:
    """Rank blocks of src (`offs`: bounds, or (lo, hi) per rank) are reduced; rank j's result
    lands at out[out_lo[j]]."""
    lo, hi = blocks(offs)
    out_lo = np.zeros(n, dtype=np.int64) if out_lo is None else np.asarray(out_lo, dtype=np.int64)
    r = np.arange(n)
    if n == 1:
        return single_rank_reducescatter(np.array([lo[0], hi[0]]), unit, src, out, out_lo)
    right = (r + 1) % n
    sizes = (hi - lo) * unit

    def step(s):
        c = (r - s - 1) % n
        last = s == n - 2
        return StepBuilder().transfers(
            r, right, unit, src if s == 0 else acc, lo[c], hi[c],
            out if last else acc, out_lo[right] if last else lo[c], rbuf=src, rlo=lo[c]).build()
    return _ring_steps(n - 1, n, step, sizes, lambda s: s + 1, True, "rs")


def allgather(n: int, offs, unit: int, buf=OUTPUT) -> list:
    """In place: rank j's block of buf (`offs`: bounds, or (lo, hi) per rank) is already there;
    fill the others."""
    lo, hi = blocks(offs)
    r = np.arange(n)
    right = (r + 1) % n
    sizes = (hi - lo) * unit

    def step(s):
        c = (r - s) % n
        return StepBuilder().transfers(r, right, unit, buf, lo[c], hi[c], buf, lo[c]).build()
    return _ring_steps(n - 1, n, step, sizes, lambda s: s, False, "ag")


def broadcast(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    return relay_broadcast([([(root + k) % n], [(root + k + 1) % n]) for k in range(n - 1)], N, unit, root, src, dst)


def reduce(n: int, N: int, unit: int, root: int = 0, src=INPUT, dst=OUTPUT) -> list:
    """The root ends with the reduction in dst; the others use dst for partial results."""
    if n == 1 or N == 0:
        return local_copy(n, N, unit, src, dst) if src != dst else []
    steps = []
    for k in range(n - 1):
        sender, receiver = (root + 1 + k) % n, (root + 2 + k) % n
        steps.append(StepBuilder().transfers([sender], [receiver], unit, src if k == 0 else dst, 0, N, dst, 0,
                                             rbuf=src, rlo=0).build())
    return steps


def scatter_rounds(n: int, root: int) -> list:
    """Scatter (HCCL scatter_ring.cc): n - 1 steps; in step t the root sends the block of the
    rank n - t places on around the ring (the farthest first) to its right, and every rank that
    received a block for a rank beyond it forwards it one place on. Cost (n-1)(a + n/p b)."""
    rounds = []
    for t in range(1, n):
        d = np.arange(n - t, n)                       # blocks on their way: owner root + d
        h = t - (n - d)                               # hops made so far
        rounds.append(((root + h) % n, (root + h + 1) % n, (root + d) % n))
    return rounds
