"""The 950's chunked mesh (HCCL's InsTempReduceScatterMesh1DMeshChunk, run by
AicpuReduceScatterSoleMeshChunk, and InsTempAllReduceMesh1DTwoShotMeshChunk, run by
AicpuAllReduceSoleMeshChunkTwoShot; hicann/hccl @09300b70, src/ops/*/template/aicpu/; docs/
references.md §6.13): a ReduceScatter, or an AllReduce's ReduceScatter half, in n - 1 steps.

Each rank's block (an AllReduce's chunk: ceil(N / n) elements, the last ones shorter) is cut into
n - 1 pieces. In step k every rank r writes, reducing, piece i of peer f's block to f, for every i,
where f = r - m and m = k + i + 1, skipping n (DoMeshChunk, ReduceScatterMeshChunk): each peer gets
a different piece from each sender in a step (a Latin square), and over the n - 1 steps every
piece from every peer. The write reduces into the peer's CCL buffer (SendRecvBatchWriteReduce),
where the peer put its own copy first (PreCopy). An AllReduce then gathers the reduced chunks in
one mesh step (every rank reads each peer's chunk: SendRecvRead).

Pieces: a ReduceScatter's are D / (n - 1) aligned down to 4,096 bytes (AICPU_ALIGN_SIZE), the last
taking the rest; where that is 0 bytes or n = 2, and always for an AllReduce, the count is split as
evenly as it goes, the larger pieces first.
Bytes: each rank sends (n - 1)/n of its data for the ReduceScatter, D a step, and receives as much,
reduced on arrival (the receiver's reduce engine, as NHR's write-reduce: docs/references.md §6.13).

A ReduceScatter's block is cut below the row a block collective's program addresses, so it runs as
one part per piece (`block_parts`: the parts side by side, each over its range of every block).
"""
from __future__ import annotations

import numpy as np

from . import mesh
from .common import INPUT, OUTPUT, StepBuilder, local_copy

NAME = "mesh_chunk"
DESCRIPTION = "n-1 steps, each rank writing with reduce a piece of every peer's block"
COLLECTIVES = ("allreduce", "reducescatter")
LEVELS = ()                 # no token asks for it: the 950's selection runs it
ALIGN = 4096                # AICPU_ALIGN_SIZE (op_common/inc/alg_param.h:91)


def peers(n: int, k: int):
    """(ranks, piece, peer) of step k: rank r writes piece i of peer f's block to f."""
    r, i = np.divmod(np.arange(n * (n - 1)), n - 1)
    m = k + i + 1
    m = m + (m >= n)
    return r, i, (r - m) % n


def by_count(count: int, pieces: int) -> np.ndarray:
    """Bounds of `count` elements cut into `pieces`, the larger first, in HCCL's order (the
    templates' bigDataSliceNum pieces lead; common.bounds spreads them instead)."""
    sizes = np.full(pieces, count // pieces, dtype=np.int64)
    sizes[:count % pieces] += 1
    return np.concatenate(([0], np.cumsum(sizes)))


def block_cuts(count: int, n: int, itemsize: int) -> np.ndarray:
    """Bounds of a ReduceScatter block's n - 1 pieces (RunReduceScatter)."""
    aligned = count * itemsize // (n - 1) // ALIGN * ALIGN // itemsize
    if n - 1 >= 2 and aligned > 0:
        return np.concatenate((np.arange(n - 1) * aligned, [count]))
    return by_count(count, n - 1)


def allreduce(n: int, N: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    """Chunk r = [r c, (r + 1) c) of N, c = ceil(N / n): its own copied into dst, the chunked
    ReduceScatter into dst, then every chunk to every rank (mesh.allgather)."""
    if n == 1:
        return local_copy(1, N, unit, src, dst)
    c = -(-N // n)
    offs = np.minimum(np.arange(n + 1) * c, N)
    cuts = np.stack([offs[f] + by_count(int(offs[f + 1] - offs[f]), n - 1) for f in range(n)])
    r = np.arange(n)
    own = offs[1:] > offs[:-1]
    steps = [StepBuilder().copies(r[own], unit, src, offs[:-1][own], offs[1:][own], dst, offs[:-1][own]).build()]
    for k in range(n - 1):
        s, i, f = peers(n, k)
        lo, hi = cuts[f, i], cuts[f, i + 1]
        keep = hi > lo
        steps.append(StepBuilder().transfers(s[keep], f[keep], unit, src, lo[keep], hi[keep], dst, lo[keep],
                                             rbuf=dst, rlo=lo[keep]).build())
    return steps + mesh.allgather(n, offs, unit, dst)


def block_parts(p: int, length: int, itemsize: int) -> list:
    """A ReduceScatter of blocks of `length` elements as ((lo, hi, program), ...), one part per
    piece, each a program on rows of its piece's elements: the own row copied into the output,
    then the n - 1 steps writing piece i of the peers' rows into their output, reducing."""
    if p == 1:
        return [(0, length, local_copy(1, 1, length * itemsize, INPUT, OUTPUT))]
    cuts = block_cuts(length, p, itemsize)
    r = np.arange(p)
    parts = []
    for i in range(p - 1):
        lo, hi = int(cuts[i]), int(cuts[i + 1])
        if hi <= lo:
            continue
        unit = (hi - lo) * itemsize
        steps = [StepBuilder().copies(r, unit, INPUT, r, r + 1, OUTPUT, 0).build()]
        for k in range(p - 1):
            s, piece, f = peers(p, k)
            s, f = s[piece == i], f[piece == i]
            steps.append(StepBuilder().transfers(s, f, unit, INPUT, f, f + 1, OUTPUT, 0, rbuf=OUTPUT, rlo=0).build())
        parts.append((lo, hi, steps))
    return parts

