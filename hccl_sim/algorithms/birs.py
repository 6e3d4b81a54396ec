"""BIRS: HCCL's batch-invariant ReduceScatter on A3 (ReduceScatterBIRSExecutor, experimental).

Source: hicann/hccl 09300b70, `experimental/ops/reduce_scatter/birs/` (the executor, its templates
`reduce_scatter_birs.cc` and `reduce_scatter_birs_inter.cc`) and the RFC
`docs/en/rfcs/0001-add-batch-invariant-reducescatter.md` (docs/references.md §6.12). Selection
(when it runs, and its refusals) is hccl_sim.selection.birs.

Ranks form a logical 2-D layout inside each server of K = p / S dies (S servers): the two dies of
a package (rank XOR 1, joined by SIO) along X, the Y = K / 2 packages (HCCS, the UB fabric) along
Y. Column c(r) = (r mod K) // 2; rank r's HCCS peers are q_k = (r + 2(k + 1)) mod K in its server,
k = 0 .. Y-2. Every rank reads its input in place and writes its output itself: no CCL-buffer
staging. Units are rank blocks of m bytes; scratch holds p rows.

One server (S = 1, template REDUCE_SCATTER_BIRS), scratch rows 0..Y-1 region A (by column, the
pair sums this rank forms), Y..2Y-1 region B (by column, the pair sums its HCCS peers send):
  1. copy input block q_0 into A[c(q_0)];
  2. round k = 0 .. Y-1, one step of three streams:
     - k > 0: send A[c(q_{k-1})] to q_{k-1}, into its B[c(r)] (HCCS);
     - write-reduce input block q_k XOR 1 (the last round: the SIO peer's own block) into the SIO
       peer's A at that block's column: A there becomes the package's pair sum (SIO);
     - k < Y-1: copy the next input block (q_{k+1}, in the last but one round this rank's own)
       into A at its column;
  3. a tree of local reduces over vec = [column 0 .. Y-1] (A[c(r)] for its own column, else B),
     stride 1, 2, 4, ...: vec[i] into vec[i - stride]; then vec[0] to the output.
The sum of every element is ((x0 + x1) + (x2 + x3)) + ... over the package pair sums in column
order, the same on every rank and for any count: bit-identical whatever the batch size.

Several servers (template REDUCE_SCATTER_BIRS_INTER): the same rounds inside every server, each
moving S blocks (this die's position in every server) instead of one; then, after the tree, the
servers' partial sums of a die's own block meet across servers: round k = 1 .. S-1 sends the
partial for server g + k to the same die there, and a second tree (stride 1, 2, ...) over the
S partials, ordered from the receiving server g (its own, then g - 1, g - 2, ...), so the order
is fixed per output block, not the same for every block.

Bytes on the wire per rank (m = one block): one server, Y blocks written with a reduction over
SIO and Y - 1 plain over HCCS; several servers, Y * S over SIO, (Y - 1) * S over HCCS and S - 1
between servers. Local: Y copies (S servers: Y * S), Y - 1 local reduces of S blocks, S - 1 of one,
one copy out (and one more across servers).

Closed form, one server (α, β per link; reducing SIO writes at the inline-reduce rate; lr(n) a
local reduce of n bytes, a copy where the DMA reduces inline, cp(n) a copy):
  cp(m) + Y · max(α_SIO + m / β_SIO,red, α_HCCS + m / β_HCCS) + (Y - 1) · lr(m) + cp(m)
(round 0 has no HCCS send; a round's copy overlaps its transfers). Several servers: Y · S copies,
the Y rounds with S · m bytes, (Y - 1) · lr(S · m), a copy, S - 1 rounds of α + m / β between
servers, (S - 1) · lr(m), a copy.

Any Y ≥ 2 and S ≥ 1 (selection refuses fewer than 4 dies per server): the tree's strides skip
what lies past the end, as HCCL's TreeLocalReduce does, so neither count need be a power of two.

Deviations, stated: HCCL stages the SIO source of the several-server rounds (S strided input
blocks) in two scratch slots by a copy on its third stream, overlapping the writes; here the S
blocks are written straight from the input (the same bytes over SIO, no copies), so that
scratch stays p rows. HCCL's executor runs the whole count in one pass with the CCL buffer as
scratch; hccl-sim loops over CCL-buffer-sized pieces as every ReduceScatter (§6.7).
"""
from __future__ import annotations

import numpy as np

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder

NAME = "ReduceScatterBIRSExecutor"       # HCCL's algName for it (reduce_scatter_birs_selector.cc)
COLLECTIVES = ("reducescatter",)
LEVELS = ()                              # no level a token can ask for: only HCCL_BIRS_ENABLE runs it
DESCRIPTION = ("A3 batch-invariant ReduceScatter (HCCL_BIRS_ENABLE=TRUE): SIO write-reduces and HCCS sends per "
               "round, then a fixed-order tree of local reduces")
STAGED = False                           # reads the user's input and writes the user's output itself


def tree_pairs(n: int) -> list:
    """The levels of HCCL's tree over n entries: per stride 1, 2, 4, ..., the (source, target)
    index pairs reduced at it (entry i into entry i - stride)."""
    levels, stride = [], 1
    while stride < n:
        levels.append([(i, i - stride) for i in range(stride, n, 2 * stride)])
        stride *= 2
    return levels


def reducescatter(p: int, servers: int, unit: int) -> list:
    """The program over p ranks on `servers` servers of p / servers dies each (even, >= 4)."""
    K = p // servers
    if servers == 1:
        return _one_server(p, unit)
    return _servers(p, servers, K, unit)


def _layout(p: int, K: int):
    """Every rank's (rank, its server's first rank, position in the server, column, SIO peer)."""
    r = np.arange(p, dtype=np.int64)
    base = r - r % K
    return r, base, r % K, (r % K) // 2, r ^ 1


def _hccs_peer(base, local, K, k):
    """Every rank's HCCS peer q_k (k = 0 .. Y-2): two positions per round further round its server."""
    return base + (local + 2 * (k + 1)) % K


def _tree_steps(r, vec_rows, width: int, unit: int) -> list:
    """The fixed-order tree over entries vec_rows[i] (per-rank first rows, `width` rows each), as
    one step of local reduces per stride."""
    steps = []
    for level in tree_pairs(len(vec_rows)):
        b = StepBuilder()
        for src, dst in level:
            b.copies(r, unit, SCRATCH, vec_rows[src], vec_rows[src] + width, SCRATCH, vec_rows[dst],
                     rbuf=SCRATCH, rlo=vec_rows[dst])
        steps.append(b.build())
    return steps


def _one_server(p: int, unit: int) -> list:
    Y = p // 2
    r, base, local, col, sio = _layout(p, p)
    peers = [_hccs_peer(base, local, p, k) for k in range(Y - 1)]
    steps = [StepBuilder().copies(r, unit, INPUT, peers[0], peers[0] + 1, SCRATCH, peers[0] // 2).build()]
    for k in range(Y):
        b = StepBuilder()
        if k > 0:
            q = peers[k - 1]
            b.transfers(r, q, unit, SCRATCH, q // 2, q // 2 + 1, SCRATCH, Y + col)
        block = peers[k] ^ 1 if k < Y - 1 else sio
        b.transfers(r, sio, unit, INPUT, block, block + 1, SCRATCH, block // 2, rbuf=SCRATCH, rlo=block // 2)
        if k < Y - 1:
            nxt = peers[k + 1] if k < Y - 2 else r
            b.copies(r, unit, INPUT, nxt, nxt + 1, SCRATCH, nxt // 2)
        steps.append(b.build())
    vec = [np.where(col == i, i, Y + i) for i in range(Y)]
    steps += _tree_steps(r, vec, 1, unit)
    steps.append(StepBuilder().copies(r, unit, SCRATCH, vec[0], vec[0] + 1, OUTPUT, 0).build())
    return steps


def _servers(p: int, S: int, K: int, unit: int) -> list:
    """Scratch as 2Y super-slots of S rows (row cnt: the block of server cnt); super-slot 1 holds
    the S partials across servers once the tree inside the server has consumed it."""
    Y = K // 2
    r, base, local, col, sio = _layout(p, K)
    g, parity = r // K, r % 2
    peers = [_hccs_peer(base, local, K, k) for k in range(Y - 1)]
    servers = np.arange(S, dtype=np.int64)
    pre = StepBuilder()
    for j in range(Y):
        for cnt in servers:
            pre.copies(r, unit, INPUT, cnt * K + 2 * j + parity, cnt * K + 2 * j + parity + 1, SCRATCH, j * S + cnt)
    steps = [pre.build()]
    for k in range(Y):
        b = StepBuilder()
        if k > 0:
            q = peers[k - 1]
            qcol = (q % K) // 2
            b.transfers(r, q, unit, SCRATCH, qcol * S, qcol * S + S, SCRATCH, (Y + col) * S)
        position = (peers[k] % K) ^ 1 if k < Y - 1 else local ^ 1
        for cnt in servers:
            row = (position // 2) * S + cnt
            b.transfers(r, sio, unit, INPUT, cnt * K + position, cnt * K + position + 1, SCRATCH, row,
                        rbuf=SCRATCH, rlo=row)
        steps.append(b.build())
    vec = [np.where(col == i, i, Y + i) * S for i in range(Y)]
    steps += _tree_steps(r, vec, S, unit)
    gathered = S                             # row of super-slot 1: the partials of this die's own block
    steps.append(StepBuilder().copies(r, unit, SCRATCH, vec[0] + g, vec[0] + g + 1, SCRATCH, gathered).build())
    for k in range(1, S):
        to = (g + k) % S
        steps.append(StepBuilder().transfers(r, to * K + local, unit, SCRATCH, vec[0] + to, vec[0] + to + 1,
                                             SCRATCH, gathered + k).build())
    steps += _tree_steps(r, [np.full(p, gathered + i, dtype=np.int64) for i in range(S)], 1, unit)
    steps.append(StepBuilder().copies(r, unit, SCRATCH, gathered, gathered + 1, OUTPUT, 0).build())
    return steps
