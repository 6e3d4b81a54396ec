"""The 950's PipeLine AllGather (HCCL's OmniPipe, AicpuAllGatherPipeLine; docs/references.md
§6.13) as a program: the pieces of algorithms.omnipipe_plan, each level's moved by that level's
template (x: the server's mesh, one step; y and z: NHR among a SuperPoD's servers and among the
SuperPoDs), in HCCL's order (ins_v2_all_gather_omnipipe_executor.cc:469-578): outer step o, its
inner steps i one after another, x and y of an inner step side by side, and z's piece of outer
step o running through the outer step's inner steps.

Global steps: an inner step is K = max(1, ceil(log2 N1), ceil(log2 N2)) steps (room for an NHR's
rounds); z's piece of an outer step is cut into one sub-piece per inner step, each sub-piece's
rounds in its inner step: z uses only the UBoE ports, which no x or y transfer touches, so the
rank's z traffic and its x and y traffic overlap as HCCL's threads do, while no port is busy
across steps (the timing engines' rule). Deviation, stated: HCCL's z thread runs its whole piece
at once, here in equal sub-pieces.

Two views of one schedule (plan.loop_programs' `loop_parts` keeps them apart):
- data: one part per elementary byte range (the pieces' boundaries cut each block), each part a
  small program moving its range of the blocks it concerns, every dependency inside it;
- timing: one program of HCCL's pieces, each level's transfer carrying its piece's bytes once
  per block of its list (`common.repeat_rows`' counting: a list of q blocks is q transfers one
  after another), the same bytes between the same pairs in the same steps as the parts.
"""
from __future__ import annotations

import numpy as np

from . import mesh, nhr
from hcomm.program import LazyStep

from .common import INPUT, OUTPUT, StepBuilder, ceil_log2, one_row_each, repeat_rows, side_by_side, tile
from .omnipipe_plan import allgather_plan

def _empty():
    """A step with nothing in it, of no groups (so a step it is concatenated into keeps its
    parts' groups: hcomm.vgroups prices them once per group)."""
    step = StepBuilder().build()
    step.groups = ()
    return step


class _Levels:
    """Groups and block lists of the three levels on (N2, N1, N0) ranks M[z, y, x]."""

    def __init__(self, M):
        self.M = M
        n2, n1, n0 = M.shape
        self.groups = {"x": M.reshape(-1, n0), "y": M.transpose(0, 2, 1).reshape(-1, n1),
                       "z": M.transpose(1, 2, 0).reshape(-1, n2)}
        self.algo = {"x": mesh, "y": nhr, "z": nhr}

    def rows(self, level: str, kind: str, of: str) -> np.ndarray:
        """(groups, members, q) rows (block ids = ranks) each member contributes to its group."""
        M = self.M
        n2, n1, n0 = M.shape
        z, y, x = np.meshgrid(np.arange(n2), np.arange(n1), np.arange(n0), indexing="ij")

        def others(n, own):       # (..., n - 1) indices other than `own`
            idx = np.arange(n)
            return np.stack([np.delete(idx, k) for k in range(n)])[own]
        zs = z[..., None] if of == "own" else others(n2, z)
        if level == "z":
            if kind == "own":
                out = M[z, y, x][..., None]
            else:                     # the rest of its SuperPoD's blocks
                flat = others(n1 * n0, y * n0 + x)
                out = M.reshape(n2, -1)[z[..., None], flat]
            return out.transpose(1, 2, 0, 3).reshape(-1, n2, out.shape[-1])
        if level == "x":
            ys = y[..., None] if kind == "own" else others(n1, y)
            out = M[zs[..., :, None], ys[..., None, :], x[..., None, None]].reshape(n2, n1, n0, -1)
            return out.reshape(-1, n0, out.shape[-1])
        xs = x[..., None] if kind == "own" else others(n0, x)
        out = M[zs[..., :, None], y[..., None, None], xs[..., None, :]].reshape(n2, n1, n0, -1)
        return out.transpose(0, 2, 1, 3).reshape(-1, n1, out.shape[-1])

    def virtual(self, level: str) -> list:
        """The level's template over its group members, one row each, in full steps of one-row
        transfers (row v: member v's contribution)."""
        n = self.groups[level].shape[1]
        return one_row_each([st.full() for st in self.algo[level].allgather(n, np.arange(n + 1), 1, OUTPUT)])

    def data_steps(self, level: str, rows: np.ndarray, unit: int) -> list:
        """The level's template moving every member's rows (each one row of `unit` bytes) to every
        other member of its group."""
        groups = self.groups[level]
        out = []
        for st in self.virtual(level):
            g = np.arange(len(groups))[:, None]
            src, dst = groups[g, st.t_src[None, :]], groups[g, st.t_dst[None, :]]       # (G, T)
            r = rows[g, st.t_slo[None, :]]                                              # (G, T, q)
            q = r.shape[-1]
            src, dst, r = np.repeat(src.reshape(-1), q), np.repeat(dst.reshape(-1), q), r.reshape(-1)
            out.append(StepBuilder().transfers(src, dst, unit, OUTPUT, r, r + 1, OUTPUT, r).build())
        return out

    def timing_steps(self, level: str, q: int, nbytes: int) -> list:
        """The level's template with each transfer one of `q` of `nbytes` bytes."""
        groups = self.groups[level]
        n = groups.shape[1]
        base = self.algo[level].allgather(n, np.arange(n + 1), nbytes, OUTPUT)
        # repeated before it is tiled, so the tiled steps keep their groups (hcomm.vgroups)
        return tile(repeat_rows(base, q, (0, 0, 0)) if q > 1 else base, groups)


def _placed(steps: list, at: int, total: int) -> list:
    """`steps` as a program of `total` steps starting at step `at` (empty before and after)."""
    empty = _empty()
    return [empty] * at + list(steps) + [empty] * (total - at - len(steps))


def _lazy(build, nsteps: int) -> list:
    """`nsteps` steps built together when the first is asked for (a part's data moves, built only
    where data runs)."""
    made = []

    def step(k):
        if not made:
            made.extend(build())
        return made[k]
    return [LazyStep(lambda k=k: step(k)) for k in range(nsteps)]


def _blocks(level: str, kind: str, of: str, n0: int, n1: int, n2: int) -> int:
    """How many blocks a member's list holds (the rows it contributes per piece)."""
    across = {"x": n1 - 1, "y": n0 - 1, "z": n1 * n0 - 1}[level] if kind == "across" else 1
    return across * (n2 - 1 if of == "zpeers" else 1)


def allgather_parts(M, length: int, itemsize: int):
    """(timing program, data parts) of one loop of an AllGather of `length` elements of
    `itemsize` bytes per rank on ranks M[z, y, x] (superpod.Pods.M). Data parts: ((lo, hi,
    program), ...) over each block's elements, programs on rows of (hi - lo) elements."""
    M = np.asarray(M)
    n2, n1, n0 = M.shape
    plan = allgather_plan(n0, n1, n2, length * itemsize)
    lv = _Levels(M)
    rounds = {"x": 1, "y": ceil_log2(n1), "z": ceil_log2(n2)}
    width = max(1, rounds["y"], rounds["z"])
    actions = []            # (level, kind, of, lo, hi in elements, global step)
    for p in plan.pieces:
        lo, hi = p.lo // itemsize, (p.lo + p.size) // itemsize
        if hi <= lo:
            continue
        if p.level != "z":
            actions.append((p.level, p.kind, p.of, lo, hi, (p.outer * plan.inner + p.inner) * width))
            continue
        cuts = lo + (np.arange(plan.inner + 1) * (hi - lo)) // plan.inner     # a sub-piece per inner step
        for i in range(plan.inner):
            if cuts[i + 1] > cuts[i]:
                actions.append(("z", p.kind, "own", int(cuts[i]), int(cuts[i + 1]),
                                (p.outer * plan.inner + i) * width))
    # step 0 copies each rank's input into its row (HCCL's LocalCopy before the loops): every
    # level's steps come after it
    actions = [(level, kind, of, lo, hi, at + 1) for level, kind, of, lo, hi, at in actions]
    total = max([at + rounds[level] for level, _, _, _, _, at in actions] + [1])
    ranks = M.reshape(-1)
    timing = [_placed([StepBuilder().copies(ranks, length * itemsize, INPUT, 0, 1, OUTPUT, ranks).build()], 0, total)]
    for level, kind, of, lo, hi, at in actions:
        q = _blocks(level, kind, of, n0, n1, n2)
        timing.append(_placed(lv.timing_steps(level, q, (hi - lo) * itemsize), at, total))
    cuts = sorted({0, length} | {a for _, _, _, a, _, _ in actions} | {b for _, _, _, _, b, _ in actions})
    parts = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        # each part's own steps: a data program's first step holds its LoopBody (hcomm.exec)
        own = StepBuilder().copies(ranks, 1, INPUT, 0, 1, OUTPUT, ranks).build()
        programs = [_placed([own], 0, total)]
        for level, kind, of, a, b, at in actions:
            if a <= lo and hi <= b:
                build = (lambda level=level, kind=kind, of=of:
                         lv.data_steps(level, lv.rows(level, kind, of), 1))
                programs.append(_placed(_lazy(build, rounds[level]), at, total))
        parts.append((lo, hi, side_by_side(*programs)))
    return side_by_side(*timing), parts
