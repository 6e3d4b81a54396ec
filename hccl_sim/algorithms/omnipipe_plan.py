"""HCCL's OmniPipe slicing for the 950's PipeLine AllGather (hicann/hccl @09300b70,
src/ops/op_common/omnipipe_data_slice_calc.cc; docs/references.md §6.13): how one CCL-buffer loop
of a three-level AllGather is cut into pieces, which level moves which piece of which blocks in
which step. The program built from it is algorithms.omnipipe.

Levels: x the 8 NPUs of a server (mesh), y the same-index NPUs of a SuperPoD's servers (NHR), z the
same-index NPUs of the SuperPoDs (NHR). Equivalent bandwidths (HCCL model constants, the executor's
(rank size - 1) division): x 50, y 50 / (N1 - 1), z 25 / (N2 - 1) (BW_OMNI_DEFAULT,
BW_OMNI_UBX_ROCE; ins_v2_all_gather_omnipipe_executor.cc:342-374).

A 2D AllGather over a slow axis A and a fast axis B (CalAllgatherDataSize2D, CalAllgather2DOffset):
B sends its own block whole in step 0; A sends its own block in pieces over steps 0 .. S-2; B
forwards in step t the A-peers' pieces A sent in step t-1; in the last step the rest of the
diagonal goes both ways (A forwards the B-peers' blocks received in step 0). Three levels nest two
of these: z against xy (xy one axis of N0 x N1 ranks), and each step's xy part an x-y 2D of its
own. Sizes are bytes, aligned down to 512 (HCCL_MIN_SLICE_ALIGN_OMNIPIPE), at most 5 steps a 2D
(MAX_STEP_NUM).
"""
from __future__ import annotations

import math
from typing import NamedTuple

ALIGN = 512
MAX_STEPS = 5
BANDWIDTH = (50.0, 50.0, 25.0)      # x, y (BW_OMNI_DEFAULT), z (BW_OMNI_UBX_ROCE): HCCL model constants


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
    """What one level moves in one step: `blocks` ("own", "across": the other-axis peers' blocks
    forwarded) of the block set `of` ("own" block, or "zpeers": the N2 - 1 blocks of the same
    position in the other SuperPoDs) over bytes [lo, lo + size) of each block."""
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


def allgather_plan(n0: int, n1: int, n2: int, nbytes: int) -> Plan:
    """CalcAGOmniPipeSliceInfo (:923-1444) for blocks of `nbytes`: every level's pieces."""
    xb, yb0, zb0 = BANDWIDTH
    yb, zb = yb0 / (n1 - 1) if n1 > 1 else yb0, zb0 / (n2 - 1) if n2 > 1 else zb0
    xy_slow_x = yb >= xb
    xyb = bandwidth2d(xb, yb, n0, n1) if xy_slow_x else bandwidth2d(yb, xb, n1, n0)
    z_slow = xyb > zb
    if z_slow:
        outer = plan2d(zb, xyb, n2, n0 * n1, nbytes)
        z, xy, z_off, xy_off = outer.slow, outer.fast, outer.slow_off, outer.fast_off
        z_corner, xy_corner = max(outer.steps - 1, 1), 1
    else:
        outer = plan2d(xyb, zb, n0 * n1, n2, nbytes)
        xy, z, xy_off, z_off = outer.slow, outer.fast, outer.slow_off, outer.fast_off
        z_corner, xy_corner = 1, max(outer.steps - 1, 1)
    pieces = []
    inner_steps = 1
    for o in range(outer.steps):
        if n2 > 1:
            pieces.append(Piece("z", o, -1, "own" if o < z_corner else "across", "own", z_off[o], z[o]))
        inner = plan2d(xb, yb, n0, n1, xy[o]) if xy_slow_x else plan2d(yb, xb, n1, n0, xy[o])
        inner_steps = inner.steps
        if xy_slow_x:
            xs, ys, x_off, y_off = inner.slow, inner.fast, inner.slow_off, inner.fast_off
            x_corner, y_corner = max(inner.steps - 1, 1), 1
        else:
            ys, xs, y_off, x_off = inner.slow, inner.fast, inner.slow_off, inner.fast_off
            x_corner, y_corner = 1, max(inner.steps - 1, 1)
        of = "own" if o < xy_corner else "zpeers"
        for i in range(inner.steps):
            if n0 > 1:
                pieces.append(Piece("x", o, i, "own" if i < x_corner else "across", of, xy_off[o] + x_off[i], xs[i]))
            if n1 > 1:
                pieces.append(Piece("y", o, i, "own" if i < y_corner else "across", of, xy_off[o] + y_off[i], ys[i]))
    return Plan(outer.steps, inner_steps, tuple(pieces))
