"""The two executors of the engine contract (engines/base.py), shared by every engine.

- `central_share`: a share of the op's serial data program over every rank's buffers
  (hccl_sim.dataplane), for participants that can address all ranks' memory;
- `per_rank`: this rank's own schedule over an hcomm Transport (hcomm.executor), for ranks that
  share no memory: each rank posts its own slices to the peers its schedule names.
"""
from __future__ import annotations

import numpy as np

from hcomm.executor import execute as execute_schedule
from hcomm.program import BUFFERS

from ..dataplane import move_share
from ..programs import program_moves_for, program_rank_steps
from ..types import ReduceOp, reduce_ufunc, reducer

COLLECTIVE_TAG = "coll"
_EMPTY = np.empty(0, dtype=np.uint8)


def with_scratch(plan, buffers, p: int):
    """RankBuffers with the scratch area the op's schedule uses (allocated when not given)."""
    if buffers.scratch is not None or buffers.input is None or not plan.collective.has_scratch:
        return buffers
    return buffers._replace(scratch=plan.collective.scratch(p, plan.loops, buffers.input.dtype))


def central_share(plan, buffers: list, redop, part: int = 0, parts: int = 1, until=None) -> None:
    """Share `part` of `parts` of the op's data moves, on every rank's RankBuffers (rank order,
    scratch allocated: see with_scratch); `until`: (rank, steps), only what comes before that
    rank's step number `steps` (dataplane.move_share)."""
    move_share(plan, [tuple(b) for b in buffers], redop, part, parts, until)


def own_result(plan, inputs, out, redop, rank: int) -> None:
    """`rank`'s output into `out`, computed from every rank's input (`inputs`, stacked on a first
    axis of p) by the moves that decide it: for a rank holding every rank's input (the eager
    protocol). Exact: the same moves, in the same order, as the whole program."""
    p = inputs.shape[0]
    OwnResult(plan, rank, p, inputs.shape[1:], inputs.dtype, redop).run(inputs, out)


class OwnResult:
    """own_result compiled for one (plan, rank, input shape, dtype, redop): persistent buffers for
    every rank's input, output and scratch, and each deciding move bound to its views, so that an
    engine repeating a small op (a training loop's many tiny AllReduces) pays one ufunc call per
    move and nothing else. Build once, `run` many times (not thread-safe: one per rank).

    Tiny float32/float64 sums and products (moves of a few elements, where a ufunc call's fixed
    cost of ~1 us is all the work) run element by element on numpy scalars instead: the same
    operations in the same order, each an IEEE-rounded operation of the dtype itself, so the
    result is bit-identical to the ufunc path's."""

    SCALAR_DTYPES = ("float32", "float64")
    SCALAR_ELEMENTS_PER_MOVE = 4        # scalar ops cost ~0.1 us, a ufunc call ~1 us

    def __init__(self, plan, rank: int, p: int, shape: tuple, dtype, redop):
        coll = plan.collective
        dtype = np.dtype(dtype)
        self.rank = rank
        self.inputs = np.zeros((p,) + tuple(shape), dtype=dtype)
        ufunc = reduce_ufunc(redop) if redop is not None else None
        ops = []
        self.scalar = None
        if not coll.block:                  # vector layouts: every view is a slice of one row
            xs = self.inputs.reshape(p, -1)
            outs = np.zeros((p, xs.shape[1]), dtype=dtype)
            self.result = outs[rank]
            loops = [((a, b), program_moves_for(program, rank)) for (a, b), program in plan.loop_programs()]
            for (a, b), moves in loops:
                views = [(xs[j, a:b], outs[j, a:b], None) for j in range(p)]
                ops += _bound(moves, views, ufunc)
            if dtype.name in self.SCALAR_DTYPES and redop in (None, ReduceOp.SUM, ReduceOp.PROD):
                program = _scalar_program(loops, p, xs.shape[1], rank, self.SCALAR_ELEMENTS_PER_MOVE)
                if program is not None:
                    self.scalar = _scalar_function(*program, p * xs.shape[1], dtype.type(0),
                                                   "*" if redop is ReduceOp.PROD else "+")
        else:
            out_shape = coll.output_shape(tuple(shape), p)
            outs = [np.zeros(out_shape, dtype=dtype) for _ in range(p)]
            self.result = outs[rank]
            scratch = ([coll.scratch(p, plan.loops, dtype) for _ in range(p)] if coll.has_scratch else [None] * p)
            for (a, b), program in plan.loop_programs():
                named = [coll.views(p, self.inputs[j], outs[j], scratch[j], a, b) for j in range(p)]
                ops += _bound(program_moves_for(program, rank), [[v.get(n) for n in BUFFERS] for v in named], ufunc)
        self.ops = ops

    def run(self, inputs, out) -> None:
        """`inputs`: every rank's input stacked (p, *shape), or a bytes-like of them in rank order."""
        if self.scalar is not None:
            self._run_scalar(inputs, out)
            return
        if isinstance(inputs, np.ndarray):
            np.copyto(self.inputs, inputs)
        else:
            self.inputs.reshape(-1).view(np.uint8)[:] = np.frombuffer(inputs, dtype=np.uint8)
        copyto = np.copyto
        for fn, src, other, dst in self.ops:
            if fn is None:
                copyto(dst, src)
            else:
                fn(src, other, out=dst)
        out.reshape(-1)[:] = self.result.reshape(-1)

    def _run_scalar(self, inputs, out) -> None:
        cells = list(inputs.reshape(-1) if isinstance(inputs, np.ndarray)
                     else np.frombuffer(inputs, dtype=self.inputs.dtype))
        if out.ndim == 1:
            out[:] = self.scalar(cells)
        else:
            out.reshape(-1)[:] = self.scalar(cells)


def _scalar_program(loops, p: int, n: int, rank: int, per_move: int):
    """(ops, lo, hi): the moves of `loops` as element operations (dst, src, other or -1 for a copy)
    on one flat list of cells: every rank's input row, then every rank's output row, n cells each;
    `rank`'s output is cells[lo:hi]. None when the moves are long enough for ufunc calls to win."""
    def cell(j, buf, e):
        return (j if buf == 0 else p + j) * n + e     # vector views: buffer 0 the input, 1 the output
    ops, seen = [], 0
    for (a, _), moves in loops:
        for s, sb, sl, sh, d, db, dl, dh, rb, rl, rh in moves:
            seen += 1
            for k in range(dh - dl):
                ops.append((cell(d, db, a + dl + k), cell(s, sb, a + sl + k),
                            -1 if rb < 0 else cell(d, rb, a + rl + k)))
            if len(ops) > per_move * seen + 16:
                return None
    return ops, (p + rank) * n, (p + rank + 1) * n


def _scalar_function(ops, lo: int, hi: int, inputs: int, zero, sign: str):
    """The element operations of _scalar_program as one compiled function of every rank's input
    cells, returning `rank`'s output cells: straight-line code, a local per operation, so a tiny
    op pays for its additions and nothing else (no list of cells, no loop). The operations and
    their operands' order are the program's, each the dtype's own IEEE-rounded numpy-scalar
    operation: bit-identical to the ufunc path. Output cells no move writes stay `zero`."""
    expr = {}                           # cell -> the expression holding its value now
    lines = []
    for d, src, other in ops:
        a = expr.get(src, f"c[{src}]" if src < inputs else "zero")
        if other < 0:
            expr[d] = a                 # a copy: the same value under another cell
            continue
        b = expr.get(other, f"c[{other}]" if other < inputs else "zero")
        lines.append(f"    v{len(lines)} = {a} {sign} {b}")
        expr[d] = f"v{len(lines) - 1}"
    result = ", ".join(expr.get(cell, f"c[{cell}]" if cell < inputs else "zero") for cell in range(lo, hi))
    source = "def own(c):\n" + "\n".join(lines + [f"    return ({result},)"]) + "\n"
    scope = {"zero": zero}
    exec(compile(source, "<own result>", "exec"), scope)    # noqa: S102 - code generated from the plan
    return scope["own"]


def _bound(moves, buffers, ufunc) -> list:
    """(ufunc or None for a copy, source view, other operand view, destination view) of each move,
    its views sliced once."""
    ops = []
    for s, sb, sl, sh, d, db, dl, dh, rb, rl, rh in moves:
        dst = buffers[d][db][dl:dh]
        if rb < 0:
            ops.append((None, buffers[s][sb][sl:sh], None, dst))
        else:
            ops.append((ufunc, buffers[s][sb][sl:sh], buffers[d][rb][rl:rh], dst))
    return ops


def per_rank(rank: int, plan, buffers, redop, transport, size: int, steps: int | None = None) -> None:
    """Execute `rank`'s schedule of every loop over `transport` (buffers registered per loop);
    with `steps`, only its first `steps` steps (counted over the loops): what a rank that dies
    as the next one starts has sent (a fault plan's rank_crash mid-op)."""
    reduce_fn = reducer(redop) if redop is not None else None
    deadline = transport.deadline()
    coll = plan.collective
    left = steps
    if not coll.carries_data:
        transport.register(rank, "input", _EMPTY)
    else:
        buffers = with_scratch(plan, buffers, size)
    for (a, b), program in plan.loop_programs():
        if left is not None and left <= 0:
            return
        schedule = program_rank_steps(program, size)[rank]
        if left is not None:
            schedule, left = schedule[:left], left - len(schedule)
        if coll.carries_data:
            for name, view in coll.views(size, buffers.input, buffers.output, buffers.scratch, a, b).items():
                transport.register(rank, name, view)
        execute_schedule(schedule, rank, transport, COLLECTIVE_TAG, reduce_fn if coll.carries_data else None,
                         deadline, coll.method)
