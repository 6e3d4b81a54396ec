"""A data program: everything needed to move one collective call's bytes, and nothing else.

A collective's plan (the collective layer's OpPlan) is lowered once to a `DataProgram`:
- its loops, each an element range [start, stop) of the op and the `LoopBody` that moves it;
- how each named buffer ("input", "output", "scratch") is cut into a loop's view: a `layout` of
  row counts (0: a flat vector, whose view is elements [start, stop); k: the array seen as k rows,
  whose view is columns [start, stop) of every row);
- the scratch area's shape, the reduction (a numpy ufunc, or None) and the op's name for errors.

Executors (hcomm.exec.central, .per_rank, .own_result) take a DataProgram and never look back at
the plan: nothing here knows what an AllReduce is. A `LoopBody` wraps one loop program (a list of
hcomm.program steps) and derives, once, what executors need of it: the serial moves, whether
they are index-aligned, every rank's step list, and the moves that decide one rank's output. It is
cached on the program's first step, so every plan that shares a program (the cost model caches
programs) shares its lowering too.
"""
from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import numpy as np

from .. import program as prog

BUFFERS = prog.BUFFERS
COLLECTIVE_TAG = "coll"
"""The tag of a collective's messages between the ranks of the world communicator (executors')."""
_LOCK = threading.RLock()       # re-entered: what `derived` makes may ask for rank_steps


class LoopBody:
    """The executable forms of one loop program, each derived on first use and kept."""
    __slots__ = ("program", "_moves", "_aligned", "_rank_steps", "_step_indices", "_moves_for", "_derived")

    def __init__(self, program: list):
        self.program = program
        self._moves = self._aligned = self._rank_steps = None
        self._step_indices, self._moves_for, self._derived = {}, {}, {}

    @staticmethod
    def of(program: list) -> "LoopBody":
        """The body of `program`, shared by everyone holding the same program object."""
        if not program:
            return LoopBody(program)
        holder = program[0].cache
        body = holder.get("loop_body")
        if body is None:
            with _LOCK:
                body = holder.get("loop_body")
                if body is None:
                    body = holder["loop_body"] = LoopBody(program)
        return body

    @property
    def moves(self) -> list:
        """The serial data program: plain move tuples (hcomm.program.data_moves), moves of empty
        slices dropped (a tiny op's empty chunks move nothing, and each costs a numpy call)."""
        if self._moves is None:
            moves = [m for m in prog.data_moves(self.program) if m[6] < m[7]] if self.program else []
            self._aligned = prog.index_aligned(moves)
            self._moves = moves
        return self._moves

    @property
    def aligned(self) -> bool:
        """Whether every move pairs equal index ranges (disjoint ranges can then run apart)."""
        self.moves
        return self._aligned

    def moves_before(self, stop: int) -> list:
        """The moves of the first `stop` global steps (what a rank dying mid-op has done; not kept)."""
        return [m for m in prog.data_moves(self.program[:stop]) if m[6] < m[7]]

    def rank_steps(self, p: int) -> list:
        """Every rank's step list (tuples of hcomm.steps ops)."""
        got = self._rank_steps
        if got is None or len(got) != p:
            # Every rank of an op asks at once: one derives them while the others wait, instead of
            # each deriving every rank's (O(ranks^2) work, all of it contending for the GIL).
            with _LOCK:
                got = self._rank_steps
                if got is None or len(got) != p:
                    got = self._rank_steps = prog.rank_steps(self.program, p) if self.program else [()] * p
        return got

    def step_indices(self, rank: int) -> list:
        """The global steps `rank` has an op in: its step k is global step step_indices(rank)[k]."""
        got = self._step_indices.get(rank)
        if got is None:
            got = self._step_indices[rank] = prog.rank_step_indices(self.program, rank)
        return got

    def derived(self, key, make):
        """What an executor derives from this body once per `key` (`make(self)`), kept with it."""
        got = self._derived.get(key)
        if got is None:
            with _LOCK:                 # every rank of an op may ask at once: one makes it
                got = self._derived.get(key)
                if got is None:
                    if len(self._derived) >= 64:
                        self._derived.clear()
                    got = self._derived[key] = make(self)
        return got

    def moves_for(self, rank: int) -> list:
        """The moves deciding `rank`'s output (a backward slice of the serial program)."""
        got = self._moves_for.get(rank)
        if got is None:
            got = self._moves_for[rank] = (prog.moves_for(self.moves, rank, BUFFERS.index("output"))
                                           if self.program else [])
        return got


class DataLoop(NamedTuple):
    start: int          # the loop's first element of the op (per row for row layouts)
    stop: int
    body: LoopBody


class DataProgram(NamedTuple):
    """One collective call's data movement, self-contained (see the module docstring)."""
    name: str                          # the op, for errors ("all_reduce")
    size: int                          # ranks
    loops: tuple                       # DataLoop, in order
    layout: tuple                      # rows of (input, output, scratch): 0 flat, k rows, None absent
    scratch_shape: Optional[tuple]     # the scratch area every rank needs, or None
    reduce: object = None              # the numpy ufunc reducing received data, or None
    carries_data: bool = True          # False: a barrier (its schedule moves no bytes)

    @property
    def rows(self) -> bool:
        """Whether buffers are laid out as rows (a loop's moves then split by column)."""
        return any(r for r in self.layout if r)

    def views(self, x, out, scratch, a: int, b: int) -> list:
        """[input, output, scratch] views of one loop [a, b) of a rank's arrays (None where absent)."""
        return [_view(arr, rows, a, b) for arr, rows in zip((x, out, scratch), self.layout)]

    def named_views(self, x, out, scratch, a: int, b: int) -> dict:
        return {name: v for name, v in zip(BUFFERS, self.views(x, out, scratch, a, b)) if v is not None}

    def scratch_for(self, dtype) -> Optional[np.ndarray]:
        """A fresh scratch area of the op's shape (None when it uses none)."""
        return None if self.scratch_shape is None else np.empty(self.scratch_shape, dtype=dtype)

    def reduce_fn(self):
        """f(a, b, out): out = a (op) b, or None for data movement only."""
        ufunc = self.reduce
        if ufunc is None:
            return None

        def reduce(a, b, out):
            ufunc(a, b, out=out)
        return reduce


def _view(arr, rows, a, b):
    if arr is None or rows is None:
        return None
    if rows == 0:
        return arr.reshape(-1)[a:b]
    return arr.reshape(rows, -1)[:, a:b]


def with_scratch(data: DataProgram, buffers):
    """`buffers` (a (input, output, scratch) named tuple) with the scratch area allocated when the
    program uses one and none was given."""
    if buffers.scratch is not None or buffers.input is None or data.scratch_shape is None:
        return buffers
    return buffers._replace(scratch=data.scratch_for(buffers.input.dtype))


def run_copy(region, rank: int, copy, reduce_fn) -> None:
    """One local op (hcomm.steps.Copy) of `rank` on its registered memory (`region(rank, buf)`): a
    copy, or with `reduce_with` a local reduce (dst = src (op) the operand)."""
    s, d = copy.src, copy.dst
    out = region(rank, d.buf)[d.start:d.stop]
    if copy.reduce_with is None:
        np.copyto(out, region(rank, s.buf)[s.start:s.stop])
    else:
        w = copy.reduce_with
        reduce_fn(region(rank, s.buf)[s.start:s.stop], region(rank, w.buf)[w.start:w.stop], out)
