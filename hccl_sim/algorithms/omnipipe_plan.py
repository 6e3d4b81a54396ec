"""HCCL's OmniPipe slicing for the 950's PipeLine executors (hicann/hccl @09300b70,
src/ops/op_common/omnipipe_data_slice_calc.cc; docs/references.md §6.13): how one CCL-buffer loop
of a three-level AllGather or ReduceScatter (an AllReduce runs one, then the other) is cut into
pieces, which level moves which piece of which blocks in which step. The programs built from it
are algorithms.omnipipe.

Levels: x the 8 NPUs of a server (mesh), y the same-index NPUs of a SuperPoD's servers (NHR), z the
same-index NPUs of the SuperPoDs (AllGather: NHR; ReduceScatter: mesh). Equivalent bandwidths (HCCL
model constants, the executor's (rank size - 1) division): x 50, y 50 / (N1 - 1), z 25 / (N2 - 1)
(BW_OMNI_DEFAULT, BW_OMNI_UBX_ROCE; ins_v2_all_gather_omnipipe_executor.cc:342-374,
ins_v2_reduce_scatter_omnipipe_executor.cc:363-388).

A 2D AllGather over a slow axis A and a fast axis B (CalAllgatherDataSize2D, CalAllgather2DOffset):
B sends its own block whole in step 0; A sends its own block in pieces over steps 0 .. S-2; B
forwards in step t the A-peers' pieces A sent in step t-1; in the last step the rest of the
diagonal goes both ways (A forwards the B-peers' blocks received in step 0). A 2D ReduceScatter
(CalReducescatterDataSize2D, CalReducescatter2DOffset) is its mirror, the diagonal first: in step
0 A reduces the first piece of the diagonal blocks and B the next; B goes on with the diagonal up
to step S-3 while A sends, one step behind, the blocks of its own axis (partial sums holding what
B brought); the same-axis rest is split over the last two steps, A's and B's pieces disjoint in
each (a deterministic reduce). Three levels nest two of these: z against xy (xy one axis of N0 x N1
ranks), and each step's xy part an x-y 2D of its own. Sizes are bytes, aligned down to 512
(HCCL_MIN_SLICE_ALIGN_OMNIPIPE), at most 5 steps an AllGather 2D and 6 a ReduceScatter's
(MAX_STEP_NUM, + 1 for the split).
"""
from __future__ import annotations

import math
from typing import NamedTuple

ALIGN = 512
MAX_STEPS = 5
BANDWIDTH = (50.0, 50.0, 25.0)      # x, y (BW_OMNI_DEFAULT), z (BW_OMNI_UBX_ROCE): HCCL model constants
UB_MAX_DATA_SIZE = 256 << 20         # a loop's bytes of a block at most (op_common/inc/alg_param.h:37)
LOOP_SCALING_FACTOR = 0.9            # how a ReduceScatter's loop shrinks until it fits (omnipipe_data_slice_calc.h)


def _aligned(v) -> int:
    return int(v) // ALIGN * ALIGN


def _steps(n_slow: int, ratio: float, cap: int, extra: int = 1):
    """(step count, geometric ratio, whether the pieces need no scaling up)."""
    q = (n_slow - 1) / ratio
    if n_slow - ratio > 0:
        step = int(ratio + extra) if q == 1 else int(math.ceil(math.log(n_slow - ratio) / math.log(q)) + extra)
        if step <= cap:
            return step, q, True
    return cap, q, False


class Plan2D(NamedTuple):
    """A 2D AllGather's steps: the slow axis's and the fast axis's piece sizes and offsets by step."""
    steps: int
    slow: tuple
    fast: tuple
    slow_off: tuple
    fast_off: tuple


def plan2d(b_slow: float, b_fast: float, n_slow: int, n_fast: int, nbytes: int, cap: int = MAX_STEPS) -> Plan2D:
    """CalAllgatherDataSize2D and CalAllgather2DOffset (omnipipe_data_slice_calc.cc:83-107, 237-328)."""
    if n_fast == 1 or n_slow == 1:       # one axis: everything in one step on the other
        slow, fast = ((nbytes,), (0,)) if n_fast == 1 else ((0,), (nbytes,))
        return Plan2D(1, slow, fast, (0,), (0,))
    ratio = b_fast / b_slow
    step, q, unscaled = _steps(n_slow, ratio, cap)
    scale = 1.0 if unscaled else ratio / sum(q ** t for t in range(cap - 1))
    a, b = [0] * step, [0] * step
    a[0] = nbytes if step == 2 else _aligned(scale * nbytes / ratio)
    b[0] = nbytes
    sa, sb = a[0], 0
    for i in range(1, step - 1):
        if i == step - 2:
            a[i] = nbytes - sa
            b[i] = _aligned(min(int(ratio * a[i] / (n_slow - 1)), a[i - 1]))
        else:
            b[i] = a[i - 1]
            a[i] = _aligned(b[i] * (n_slow - 1) / ratio)
        sa += a[i]
        sb += b[i]
    a[step - 1] = _aligned((nbytes - sb) * (n_slow - 1) / ((n_slow - 1) + (n_fast - 1) * ratio))
    b[step - 1] = nbytes - sb - a[step - 1]
    if min(a + b) < 0:
        raise ValueError(f"OmniPipe's plan of {nbytes} bytes gave a negative piece: {a}, {b}")
    a_off, b_off = [0] * step, [0] * step
    for t in range(2, step):
        b_off[t] = b_off[t - 1] + b[t - 1]
    for t in range(1, step - 1):
        a_off[t] = a_off[t - 1] + a[t - 1]
    a_off[step - 1] = b_off[step - 1]
    b_off[step - 1] = b_off[step - 1] + a[step - 1]
    return Plan2D(step, tuple(a), tuple(b), tuple(a_off), tuple(b_off))


def rs_plan2d(b_slow: float, b_fast: float, n_slow: int, n_fast: int, nbytes: int, cap: int = MAX_STEPS + 1) -> Plan2D:
    """CalReducescatterDataSize2D and CalReducescatter2DOffset (omnipipe_data_slice_calc.cc:112-146,
    334-452): the diagonal first, the same-axis rest split over the last two steps."""
    if n_fast == 1 or n_slow == 1:
        slow, fast = ((nbytes,), (0,)) if n_fast == 1 else ((0,), (nbytes,))
        return Plan2D(1, slow, fast, (0,), (0,))
    ratio = b_fast / b_slow
    q = (n_slow - 1) / ratio
    scale = ratio / sum(q ** t for t in range(cap - 2))
    step = cap
    if n_slow - ratio > 0:
        step = int(ratio + 2) if q == 1 else int(math.ceil(math.log(n_slow - ratio) / math.log(q)) + 2)
        if step <= cap:
            scale = 1.0
        else:
            step = cap
    a, b = [0] * step, [0] * step
    if scale > 1:
        a[0] = _aligned(nbytes * scale * (n_slow - 1) ** (step - 2)
                        / (((n_fast - 1) * ratio + n_slow - 1) * ratio ** (step - 2)))
    else:
        a[0] = _aligned((n_slow - ratio) * nbytes / ((n_fast - 1) * ratio + n_slow - 1))
    b[0] = nbytes - a[0] if step == 3 else _aligned(a[0] * ratio * (n_fast - 1) / (n_slow - 1))
    sa, sb = 0, a[0] + b[0]
    for i in range(1, step - 2):
        if i == step - 3:
            b[i] = nbytes - sb
            a[i] = int(b[i] * (n_slow - 1) / ratio)
            if i == 1 and a[i] > sb:
                a[i] = sb
            elif a[i] > b[i - 1]:
                a[i] = b[i - 1]
            a[i] = _aligned(a[i])
        elif i == 1:
            a[i] = sb
            b[i] = _aligned(a[i] * ratio / (n_slow - 1))
        else:
            a[i] = b[i - 1]
            b[i] = _aligned(a[i] * ratio / (n_slow - 1))
        sa += a[i]
        sb += b[i]
    if ratio > 10:                       # BANDWIDTH_RATIO_BOUND
        a[step - 2] = nbytes - sa
    else:
        a[step - 2] = _aligned(min(int(nbytes / (1 + ratio)), nbytes - sa))
    a[step - 1] = nbytes - sa - a[step - 2]
    b[step - 2] = nbytes - a[step - 2]
    b[step - 1] = nbytes - b[step - 2]
    if min(a + b) < 0:
        raise ValueError(f"OmniPipe's ReduceScatter plan of {nbytes} bytes gave a negative piece: {a}, {b}")
    a_off, b_off = [0] * step, [0] * step
    if step > 2:
        b_off[0] = a[0]
        for t in range(1, step - 2):
            b_off[t] = b_off[t - 1] + b[t - 1]
        for t in range(2, step - 2):
            a_off[t] = a_off[t - 1] + a[t - 1]
        b_off[step - 2], b_off[step - 1] = 0, b[step - 2]
        a_off[step - 1] = a_off[step - 3] + a[step - 3] if step > 3 else 0
        a_off[step - 2] = a_off[step - 1] + a[step - 1]
    return Plan2D(step, tuple(a), tuple(b), tuple(a_off), tuple(b_off))


def bandwidth2d(b_slow: float, b_fast: float, n_slow: int, n_fast: int, cap: int = MAX_STEPS) -> float:
    """CalcBandwidth2D (:456-481): a 2D's equivalent bandwidth, from its unaligned piece ratios
    (CalAllgatherDataSizeRatio2D, :150-231)."""
    if n_fast == 1:
        return b_slow
    if n_slow == 1:
        return b_fast
    whole = n_slow * n_fast
    ds = 1.0 * whole
    ratio = b_fast / b_slow
    step, q, unscaled = _steps(n_slow, ratio, cap)
    scale = 1.0 if unscaled else ratio / sum(q ** t for t in range(cap - 1))
    x, y = [0.0] * step, [0.0] * step
    x[0], y[0] = scale * ds / (whole * ratio), ds / whole
    sx, sy = x[0], y[0]
    for i in range(1, step - 1):
        if i == step - 2:
            x[i] = ds / whole - sx
            y[i] = ratio * x[i]
        else:
            y[i] = x[i - 1] * (n_slow - 1)
            x[i] = y[i] / ratio
        sx += x[i]
        sy += y[i]
    x[step - 1] = (ds * (n_fast - 1) * (n_slow - 1) / whole - (sy - y[0]) * (n_fast - 1)) / \
        ((n_slow - 1) + (n_fast - 1) * ratio)
    return b_slow / sum(x[:step])


class Piece(NamedTuple):
    """What one level moves in one step: `blocks` of the block set `of` over bytes [lo, lo + size)
    of each block. `kind` "own": a block of the axis's own (an AllGather's sender's block; a
    ReduceScatter's receiver's: the partial sum it is owed), "across": the diagonal (the other-axis
    peers' blocks, forwarded by an AllGather, reduced on their way by a ReduceScatter). `of` "own":
    blocks of the rank's SuperPoD; "zpeers": the N2 - 1 blocks of the same position in the other
    SuperPoDs (x and y only)."""
    level: str          # "x", "y", "z"
    outer: int
    inner: int          # -1 for z (it runs through the outer step's inner steps)
    kind: str           # "own" or "across"
    of: str             # "own" or "zpeers" (x and y only)
    lo: int
    size: int


class Plan(NamedTuple):
    outer: int
    inner: int
    pieces: tuple       # Piece, every level's, every step's


def _across(same_first: bool, slow: bool, steps: int, t: int) -> bool:
    """Whether step t of a 2D of `steps` steps is the diagonal on its slow or fast axis:
    AllGather's same axis first (the slow axis's last step and the fast axis's all but its first
    are the diagonal), ReduceScatter's diagonal first (the slow axis's first step and the fast
    axis's all but its last two; none in fewer than 3 steps)."""
    if same_first:
        return t >= max(steps - 1, 1) if slow else t >= 1
    if steps <= 2:
        return False
    return t < 1 if slow else t < steps - 2


def _plan3d(plan, same_first: bool, n0: int, n1: int, n2: int, nbytes: int) -> Plan:
    """The three levels' pieces for blocks of `nbytes`, nesting 2D plans `plan` (plan2d or
    rs_plan2d) whose same-axis steps come first or last."""
    xb, yb0, zb0 = BANDWIDTH
    yb, zb = yb0 / (n1 - 1) if n1 > 1 else yb0, zb0 / (n2 - 1) if n2 > 1 else zb0
    xy_slow_x = yb >= xb
    xyb = bandwidth2d(xb, yb, n0, n1) if xy_slow_x else bandwidth2d(yb, xb, n1, n0)
    z_slow = xyb > zb
    if z_slow:
        outer = plan(zb, xyb, n2, n0 * n1, nbytes)
        z, xy, z_off, xy_off = outer.slow, outer.fast, outer.slow_off, outer.fast_off
    else:
        outer = plan(xyb, zb, n0 * n1, n2, nbytes)
        xy, z, xy_off, z_off = outer.slow, outer.fast, outer.slow_off, outer.fast_off
    pieces = []
    inner_steps = 1
    for o in range(outer.steps):
        if n2 > 1:
            kind = "across" if _across(same_first, z_slow, outer.steps, o) else "own"
            pieces.append(Piece("z", o, -1, kind, "own", z_off[o], z[o]))
        inner = plan(xb, yb, n0, n1, xy[o]) if xy_slow_x else plan(yb, xb, n1, n0, xy[o])
        inner_steps = inner.steps
        if xy_slow_x:
            xs, ys, x_off, y_off = inner.slow, inner.fast, inner.slow_off, inner.fast_off
        else:
            ys, xs, y_off, x_off = inner.slow, inner.fast, inner.slow_off, inner.fast_off
        of = "zpeers" if _across(same_first, not z_slow, outer.steps, o) else "own"
        for i in range(inner.steps):
            if n0 > 1:
                kind = "across" if _across(same_first, xy_slow_x, inner.steps, i) else "own"
                pieces.append(Piece("x", o, i, kind, of, xy_off[o] + x_off[i], xs[i]))
            if n1 > 1:
                kind = "across" if _across(same_first, not xy_slow_x, inner.steps, i) else "own"
                pieces.append(Piece("y", o, i, kind, of, xy_off[o] + y_off[i], ys[i]))
    return Plan(outer.steps, inner_steps, tuple(pieces))


def allgather_plan(n0: int, n1: int, n2: int, nbytes: int) -> Plan:
    """CalcAGOmniPipeSliceInfo (:923-1444) for blocks of `nbytes`."""
    return _plan3d(plan2d, True, n0, n1, n2, nbytes)


def reducescatter_plan(n0: int, n1: int, n2: int, nbytes: int) -> Plan:
    """CalcRSOmniPipeSliceInfo (:1469-2087) for blocks of `nbytes`."""
    return _plan3d(rs_plan2d, False, n0, n1, n2, nbytes)


def blocks(level: str, kind: str, of: str, n0: int, n1: int, n2: int) -> int:
    """How many blocks a member's list holds in a piece (what it contributes or is owed)."""
    across = {"x": n1 - 1, "y": n0 - 1, "z": n1 * n0 - 1}[level] if kind == "across" else 1
    return across * (n2 - 1 if of == "zpeers" else 1)


def _ccl_need(n0: int, n1: int, n2: int, nbytes: int) -> int:
    """CCL bytes a ReduceScatter loop of blocks of `nbytes` takes (CalcOmniPipeScratchInfo,
    CalScratchSize, CalRSDataSizeStep; :486-725): every block's working copy, and on each mesh
    level (x, z: their templates write to the peers' scratch before reducing) its largest step's
    bytes a peer times the level's size."""
    need = nbytes * n0 * n1 * n2
    for level, n in (("x", n0), ("z", n2)):
        if n > 1:
            need += n * max([blocks(p.level, p.kind, p.of, n0, n1, n2) * p.size
                             for p in reducescatter_plan(n0, n1, n2, nbytes).pieces if p.level == level] + [0])
    return need


def allgather_loop_bytes(ranks: int, ccl: int) -> int:
    """Bytes of each block one CCL-buffer loop of an AllGather moves: cclSize / R aligned down to
    128 (AG:375-388)."""
    return ccl // ranks // 128 * 128


def reducescatter_loop_bytes(n0: int, n1: int, n2: int, nbytes: int, ccl: int) -> int:
    """Bytes of each block one CCL-buffer loop of a ReduceScatter moves (an AllReduce's, of its
    chunks of ceil(N / R) elements), for blocks of `nbytes` in all and a CCL buffer of `ccl`
    bytes: CalcOmniPipeScratchInfo shrinks the loop until it fits (RS:391-418, AR:776-790); 0
    when nothing fits."""
    per = nbytes
    need = _ccl_need(n0, n1, n2, nbytes)
    if need > ccl:
        per = _aligned(nbytes / (need / ccl))
        while per and _ccl_need(n0, n1, n2, per) > ccl:
            per = _aligned(per * LOOP_SCALING_FACTOR)
    return min(per, _aligned(UB_MAX_DATA_SIZE))
