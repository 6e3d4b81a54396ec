"""The small-op result path: one rank computes its own output from every rank's input.

For a rank that holds every rank's input (the eager protocol: inputs of small ops travel with the
call), the moves that decide its output (LoopBody.moves_for) are all it runs. Exact: the same
moves, in the same order, as the whole program.

`OwnResult` is compiled once per (program, rank, shapes, dtype): persistent buffers for every
rank's input, output and scratch, each deciding move bound to its views, so an engine repeating a
small op (a training loop's many tiny AllReduces) pays one ufunc call per move and nothing else.

Tiny float32/float64 sums and products (moves of a few elements, where a ufunc call's fixed cost
of ~1 us is all the work) run element by element on Python floats instead: the same operations in
the same order, each rounded to the dtype (float64's are the dtype's own; a float32 one is exact
in float64 and rounded once, which gives the float32 operation's bits: _scalar_function), so the
result is bit-identical to the ufunc path's. Python floats, not numpy scalars: a rank of a small-op
loop runs this once per op with cold caches, where numpy's scalar machinery cost twice as much.
"""
from __future__ import annotations

import array
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
            if dtype.name in SCALAR_DTYPES and dtype.isnative and ufunc in (None, np.add, np.multiply) \
                    and outs.shape[1] == xs.shape[1]:
                program = _scalar_program(loops, p, xs.shape[1], rank, SCALAR_ELEMENTS_PER_MOVE)
                if program is not None:
                    self._code = dtype.char
                    self._cells = array.array(dtype.char, [0.0]) * outs.shape[1]
                    self._cell_bytes = memoryview(self._cells).cast("B")
                    self.scalar = _scalar_function(*program, p * xs.shape[1], self._cells,
                                                   "*" if ufunc is np.multiply else "+", dtype.char == "f")
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
        self.scalar(inputs.reshape(-1).tolist() if isinstance(inputs, np.ndarray)
                    else memoryview(inputs).cast(self._code).tolist())
        if out.flags.c_contiguous:
            out.data.cast("B")[:] = self._cell_bytes
        else:
            out[...] = np.frombuffer(self._cells, out.dtype).reshape(out.shape)


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


def _scalar_function(ops, lo: int, hi: int, inputs: int, cells, sign: str, rounds: bool):
    """The element operations of _scalar_program as one compiled function of every rank's input
    cells (Python floats), writing `rank`'s output cells into `cells` (an array.array of the dtype).

    Straight-line code on Python floats: a float64 operation is the dtype's own. A float32 one is
    done in float64 and rounded to float32 by storing it in `cells` (array 'f'): for + and * of
    two float32 values that double rounding is exact (binary64 has more than 2*24+2 bits: the
    result is the float32 operation's, bit for bit). Output cells no move writes stay 0."""
    expr = {}                           # cell -> the expression holding its value now
    lines = []
    for d, src, other in ops:
        a = expr.get(src, f"c[{src}]" if src < inputs else "0.0")
        if other < 0:
            expr[d] = a                 # a copy: the same value under another cell
            continue
        b = expr.get(other, f"c[{other}]" if other < inputs else "0.0")
        v = f"v{len(lines)}"
        if rounds:
            lines.append(f"    r[0] = {a} {sign} {b}; {v} = r[0]")
        else:
            lines.append(f"    {v} = {a} {sign} {b}")
        expr[d] = v
    outs = [expr.get(cell, f"c[{cell}]" if cell < inputs else "0.0") for cell in range(lo, hi)]
    lines += [f"    r[{k}] = {e}" for k, e in enumerate(outs)]
    source = "def own(c):\n" + "\n".join(lines or ["    pass"]) + "\n"
    scope = {"r": cells}
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
