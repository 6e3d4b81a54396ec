"""The small-op result path: one rank computes its own output from every rank's input.

For a rank that holds every rank's input (the eager protocol: inputs of small ops travel with the
call), the moves that decide its output (LoopBody.moves_for) are all it runs. Exact: the same
moves, in the same order, as the whole program.

`OwnResult` is compiled once per (program, rank, shapes, dtype): persistent buffers for every
rank's input, output and scratch, each deciding move bound to its views, so an engine repeating a
small op (a training loop's many tiny AllReduces) pays one ufunc call per move and nothing else.

Tiny float32/float64 sums and products (moves of a few elements, where a ufunc call's fixed cost
of ~1 us is all the work) run element by element on numpy scalars instead: the same operations in
the same order, each an IEEE-rounded operation of the dtype itself, so the result is
bit-identical to the ufunc path's.
"""
from __future__ import annotations

import math

import numpy as np

from .data_program import DataProgram

SCALAR_DTYPES = ("float32", "float64")
SCALAR_ELEMENTS_PER_MOVE = 4        # scalar ops cost ~0.1 us, a ufunc call ~1 us


class OwnResult:
    """`rank`'s output of `data` from every rank's input. Build once, `run` many times (not
    thread-safe: one per rank)."""

    def __init__(self, data: DataProgram, rank: int, shape: tuple, out_shape: tuple, dtype):
        dtype = np.dtype(dtype)
        p = data.size
        self.rank = rank
        self.inputs = np.zeros((p,) + tuple(shape), dtype=dtype)
        ufunc = data.reduce
        ops = []
        self.scalar = None
        if not data.rows:                   # flat layouts: every view is a slice of one row
            xs = self.inputs.reshape(p, -1)
            outs = np.zeros((p, math.prod(out_shape)), dtype=dtype)
            self.result = outs[rank]
            loops = [((a, b), body.moves_for(rank)) for a, b, body in data.loops]
            for (a, b), moves in loops:
                views = [(xs[j, a:b], outs[j, a:b], None) for j in range(p)]
                ops += _bound(moves, views, ufunc)
            if dtype.name in SCALAR_DTYPES and ufunc in (None, np.add, np.multiply):
                program = _scalar_program(loops, p, xs.shape[1], rank, SCALAR_ELEMENTS_PER_MOVE)
                if program is not None:
                    self.scalar = _scalar_function(*program, p * xs.shape[1], dtype.type(0),
                                                   "*" if ufunc is np.multiply else "+")
                    self.run = self._run_scalar         # (no dispatch in run: a loop of tiny ops calls it)
        else:
            outs = [np.zeros(out_shape, dtype=dtype) for _ in range(p)]
            self.result = outs[rank]
            scratch = [data.scratch_for(dtype) for _ in range(p)]
            for a, b, body in data.loops:
                views = [data.views(self.inputs[j], outs[j], scratch[j], a, b) for j in range(p)]
                ops += _bound(body.moves_for(rank), views, ufunc)
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


def own_result(data: DataProgram, inputs, out, rank: int) -> None:
    """`rank`'s output into `out` from every rank's input (`inputs`, stacked on a first axis)."""
    OwnResult(data, rank, inputs.shape[1:], out.shape, inputs.dtype).run(inputs, out)


def _scalar_program(loops, p: int, n: int, rank: int, per_move: int):
    """(ops, lo, hi): the moves of `loops` as element operations (dst, src, other or -1 for a copy)
    on one flat list of cells: every rank's input row, then every rank's output row, n cells each;
    `rank`'s output is cells[lo:hi]. None when the moves are long enough for ufunc calls to win."""
    def cell(j, buf, e):
        return (j if buf == 0 else p + j) * n + e     # flat views: buffer 0 the input, 1 the output
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
    cells, returning `rank`'s output cells.

    Straight-line code, a local per operation, so a tiny op pays for its additions and nothing
    else (no list of cells, no loop). The operations and their operands' order are the program's,
    each the dtype's own IEEE-rounded numpy-scalar operation: bit-identical to the ufunc path.
    Output cells no move writes stay `zero`."""
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
    exec(compile(source, "<own result>", "exec"), scope)    # noqa: S102 - code generated from the program
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
