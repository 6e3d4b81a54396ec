"""The 950's PipeLine executors (HCCL's OmniPipe: AicpuAllGatherPipeLine,
AicpuReduceScatterPipeLine, AicpuAllReducePipeLine; docs/references.md §6.13) as programs: the
pieces of algorithms.omnipipe_plan, each level's moved by that level's template (x: the server's
mesh, one step; y: NHR among a SuperPoD's servers; z among the SuperPoDs: NHR for an AllGather, a
mesh for a ReduceScatter), in HCCL's order (ins_v2_all_gather_omnipipe_executor.cc:469-578,
ins_v2_reduce_scatter_omnipipe_executor.cc:484-614): outer step o, its inner steps i one after
another, x and y of an inner step side by side, and z's piece of outer step o running through the
outer step's inner steps. An AllReduce (ins_v2_all_reduce_omnipipe_executor.cc:815-1009) runs a
ReduceScatter, then an AllGather, on blocks of ceil(N / R) elements (the last ones shorter).

Global steps: an inner step is K = the most rounds any level's template takes (1 for a mesh,
ceil(log2 n) for NHR); z's piece of an outer step is cut into one sub-piece per inner step, each
sub-piece's rounds in its inner step: z uses only the UBoE ports, which no x or y transfer
touches, so the rank's z traffic and its x and y traffic overlap as HCCL's threads do, while no
port is busy across steps (the timing engines' rule). Deviation, stated: HCCL's z thread runs its
whole piece at once, here in equal sub-pieces.

Two views of one schedule (plan.loop_programs' `loop_parts` keeps them apart):
- data: one part per elementary byte range (the pieces' boundaries cut each block), each part a
  small program moving its range of the blocks it concerns, every dependency inside it; a
  ReduceScatter's receives reduce into the block's row of the rank's working copy of every block
  (HCCL's CCL buffer: the templates write-reduce, or write and LocalReduce, into it), which later
  sends read. An AllReduce's parts are put back in one program over the loop's elements;
- timing: one program of HCCL's pieces, each level's transfer carrying its piece's bytes once
  per block of its list (`common.repeat_rows`' counting: a list of q blocks is q transfers one
  after another), the same bytes between the same pairs in the same steps as the parts.
HCCL's own copies between the user's buffers and the CCL buffer are the loop's stages (`Loop`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import mesh, nhr
from hcomm.program import ARRAYS, NONE, GlobalStep, LazyStep
from topologies.errors import HcclError

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder, ceil_log2, one_row_each, repeat_rows, side_by_side, tile
from .omnipipe_plan import (allgather_loop_bytes, allgather_plan, blocks, reducescatter_loop_bytes,
                            reducescatter_plan)


class _Half(NamedTuple):
    """An AllGather or a ReduceScatter as a PipeLine runs it: its plan, its templates by level,
    whether they gather (in place) or reduce, and whether its executor copies every block into
    the CCL buffer before the pipeline (a ReduceScatter's templates reduce there in place:
    RS:487-509) or its own only (AG:471-478)."""
    plan: object
    templates: dict
    gathers: bool
    copies_every_block: bool


_HALVES = {"allgather": _Half(allgather_plan, {"x": mesh, "y": nhr, "z": nhr}, True, False),
           # RS's level 2 is Mesh1D (RS:635-638)
           "reducescatter": _Half(reducescatter_plan, {"x": mesh, "y": nhr, "z": mesh}, False, True)}


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

    def rows(self, level: str, kind: str, of: str) -> np.ndarray:
        """(groups, members, q) rows (block ids = ranks) of each member's list: the blocks it
        contributes to its group (AllGather), or is owed by it (ReduceScatter: the same sets)."""
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

    def template(self, op: str, level: str, n: int, unit: int, buf: int) -> list:
        """The level's template over n members, one block each of `unit` bytes in rows 0..n-1 of
        `buf`: an AllGather in place, or a ReduceScatter reducing in place."""
        mod = _HALVES[op].templates[level]
        if _HALVES[op].gathers:
            return mod.allgather(n, np.arange(n + 1), unit, buf)
        return mod.reducescatter(n, np.arange(n + 1), unit, buf, buf, buf, np.arange(n))

    def data_steps(self, op: str, level: str, rows: np.ndarray, buf: int) -> list:
        """The level's template moving every member's rows (each one row) of `buf` (virtual row v
        of the template: member v's list)."""
        groups = self.groups[level]
        out = []
        for st in one_row_each([st.full() for st in self.template(op, level, groups.shape[1], 1, buf)]):
            g = np.arange(len(groups))[:, None]
            src, dst = groups[g, st.t_src[None, :]], groups[g, st.t_dst[None, :]]       # (G, T)
            r = rows[g, st.t_slo[None, :]]                                              # (G, T, q)
            q = r.shape[-1]
            reduce = np.repeat(np.broadcast_to(st.t_rbuf[None, :] >= 0, src.shape).reshape(-1), q)
            src, dst, r = np.repeat(src.reshape(-1), q), np.repeat(dst.reshape(-1), q), r.reshape(-1)
            out.append(StepBuilder().transfers(src, dst, 1, buf, r, r + 1, buf, r,
                                               rbuf=np.where(reduce, buf, NONE), rlo=r).build())
        return out

    def timing_steps(self, op: str, level: str, q: int, nbytes: int, chain: bool = True) -> list:
        """The level's template with each transfer one of `q` of `nbytes` bytes. A ReduceScatter's
        z mesh is priced as a chain: each rank's (N2 - 1) x q writes, one after another, to the
        next SuperPoD's rank, so every UBoE port sends and receives, and every reduce engine
        reduces, what it does in the mesh, each write its own transfer (its N2 (N2 - 1) pairs a
        group, tiled over the N0 x N1 groups and side by side with x and y, cost minutes to
        price on the SuperCluster; the chain is at most 3.8 % slower than the mesh on 3 to 16
        SuperPoDs, the same on 2: tests/test_omnipipe.py)."""
        groups = self.groups[level]
        n = groups.shape[1]
        if chain and level == "z" and not _HALVES[op].gathers and _HALVES[op].templates[level] is mesh and n > 2:
            r = np.arange(n)
            base = [StepBuilder().transfers(r, (r + 1) % n, nbytes, SCRATCH, r, r + 1, SCRATCH, r,
                                            rbuf=SCRATCH, rlo=r).build()]
            q *= n - 1
        else:
            base = self.template(op, level, n, nbytes, SCRATCH)
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


class _Action(NamedTuple):
    """One level's template run on elements [lo, hi) of the blocks of a list, from global step `at`."""
    op: str
    level: str
    kind: str
    of: str
    lo: int
    hi: int
    at: int


def _rounds(op: str, shape) -> dict:
    n2, n1, _ = shape
    return {"x": 1, "y": ceil_log2(n1), "z": ceil_log2(n2) if _HALVES[op].templates["z"] is nhr else 1}


def _actions(op: str, shape, length: int, itemsize: int, first: int) -> tuple:
    """(actions of one 3-level `op` on blocks of `length` elements from global step `first`, the
    step after its last)."""
    n2, n1, n0 = shape
    plan = _HALVES[op].plan(n0, n1, n2, length * itemsize)
    rounds = _rounds(op, shape)
    width = max(rounds.values())
    out = []
    for p in plan.pieces:
        lo, hi = p.lo // itemsize, (p.lo + p.size) // itemsize
        if hi <= lo:
            continue
        if p.level != "z":
            out.append(_Action(op, p.level, p.kind, p.of, lo, hi, first + (p.outer * plan.inner + p.inner) * width))
            continue
        cuts = lo + (np.arange(plan.inner + 1) * (hi - lo)) // plan.inner     # a sub-piece per inner step
        for i in range(plan.inner):
            if cuts[i + 1] > cuts[i]:
                out.append(_Action(op, "z", p.kind, "own", int(cuts[i]), int(cuts[i + 1]),
                                   first + (p.outer * plan.inner + i) * width))
    end = max([a.at + rounds[a.level] for a in out] + [first])
    return out, end


class Loop(NamedTuple):
    """One CCL-buffer loop of a PipeLine executor: its timing program and its data parts ((lo, hi,
    program), ...: block collectives over each block's elements, an AllReduce one part over the
    loop's)."""
    timing: list
    parts: list


def loop(op: str, M, length: int, itemsize: int, chain: bool = True) -> Loop:
    """One loop of `op` (OPS) of `length` elements (per block for AllGather and ReduceScatter) of
    `itemsize` bytes on ranks M[z, y, x] (superpod.Pods.M). Step 0 is the executor's copy into
    the CCL buffer before its pipeline (_Half; an AllReduce's every chunk, AR:846-857); the
    copies between the user's buffers and the CCL buffer that every executor makes are the
    loop's stages (Collective.stage_bytes), as for the other executors. `chain`: a
    ReduceScatter's z mesh priced as a chain (_Levels.timing_steps), else pair by pair."""
    return OPS[op].loop(op, np.asarray(M), length, itemsize, chain)


def _block_loop(op: str, M, length: int, itemsize: int, chain: bool) -> Loop:
    """An AllGather's or a ReduceScatter's loop: one data part per elementary range."""
    actions, end = _actions(op, M.shape, length, itemsize, 1)
    copied = length * itemsize * (M.size if _HALVES[op].copies_every_block else 1)
    timing = _timing(M, actions, copied, itemsize, end, chain)
    parts = [(lo, hi, _block_data(op, M, [a for a in actions if a.lo <= lo and hi <= a.hi], end))
             for lo, hi in _cuts(actions, length)]
    return Loop(timing, parts)


def _allreduce_loop(op: str, M, length: int, itemsize: int, chain: bool) -> Loop:
    """An AllReduce's loop: a ReduceScatter, then an AllGather, on chunks of ceil(N / R)."""
    block = -(-length // M.size)
    rs, mid = _actions("reducescatter", M.shape, block, itemsize, 1)
    ag, end = _actions("allgather", M.shape, block, itemsize, mid)
    timing = _timing(M, rs + ag, length * itemsize, itemsize, end, chain)
    return Loop(timing, [(0, length, _allreduce_data(M, rs + ag, block, length, itemsize, end))])


def _allgather_loop_bytes(n0: int, n1: int, n2: int, nbytes: int, ccl: int) -> int:
    return allgather_loop_bytes(n0 * n1 * n2, ccl)


class _Pipe(NamedTuple):
    """A PipeLine executor: how its loop is built, and how big a loop is: whether its blocks are
    chunks of the vector (ceil(N / R) elements), and the bytes of each block a loop moves; the
    algorithm its label names at level 2 (an AllReduce's: its AllGather half's)."""
    loop: object
    chunked: bool
    loop_bytes: object
    level2: str


OPS = {"allgather": _Pipe(_block_loop, False, _allgather_loop_bytes, "NHR"),
       "reducescatter": _Pipe(_block_loop, False, reducescatter_loop_bytes, "fullmesh"),
       "allreduce": _Pipe(_allreduce_loop, True, reducescatter_loop_bytes, "NHR")}
"""The ops that have a PipeLine executor."""


def loop_elements(op: str, shape, per: int, itemsize: int, ccl: int) -> int:
    """Elements one CCL-buffer loop of `op` takes (Loops' cap: per block for AllGather and
    ReduceScatter, of the vector for AllReduce), for `per` elements (per block) in all on
    (N2, N1, N0) ranks and a CCL buffer of `ccl` bytes. An AllReduce's loop takes a contiguous
    range, cut into R chunks (HCCL's takes the same share of every rank's chunk: the same sizes
    but in the last loop, where HCCL's last ranks' chunks are shorter). HcclError when no loop
    fits."""
    n2, n1, n0 = shape
    p = n0 * n1 * n2
    pipe = OPS[op]
    nbytes = (-(-per // p) if pipe.chunked else per) * itemsize
    got = pipe.loop_bytes(n0, n1, n2, nbytes, ccl) // itemsize
    if got < 1:
        raise HcclError("E_NOT_SUPPORT", f"{op}'s PipeLine on {p} ranks fits no loop in a CCL buffer of {ccl} bytes "
                        "(HCCL's CalcOmniPipeScratchInfo gives 0 bytes a loop); set a larger HCCL_BUFFSIZE")
    return got * p if pipe.chunked else got


def _cuts(actions, length: int) -> list:
    """The elementary ranges: [0, length) cut at every action's bounds."""
    cuts = sorted({0, length} | {a.lo for a in actions} | {a.hi for a in actions})
    return list(zip(cuts[:-1], cuts[1:]))


def _timing(M, actions, copied: int, itemsize: int, total: int, chain: bool) -> list:
    """The timing program: step 0 each rank's copy of `copied` bytes, then every action's template
    on its pieces."""
    n2, n1, n0 = M.shape
    lv = _Levels(M)
    ranks = M.reshape(-1)
    timing = [_placed([StepBuilder().copies(ranks, copied, INPUT, 0, 1, SCRATCH, 0).build()], 0, total)]
    for a in actions:
        q = blocks(a.level, a.kind, a.of, n0, n1, n2)
        timing.append(_placed(lv.timing_steps(a.op, a.level, q, (a.hi - a.lo) * itemsize, chain), a.at, total))
    return side_by_side(*timing)


def _moves(M, actions, buf: int, total: int) -> list:
    """The data steps of `actions` (one elementary range's) on one-row blocks of `buf`."""
    lv = _Levels(M)
    programs = []
    for a in actions:
        build = lambda a=a: lv.data_steps(a.op, a.level, lv.rows(a.level, a.kind, a.of), buf)   # noqa: E731
        n = _rounds(a.op, M.shape)[a.level]
        programs.append(_placed(_lazy(build, n), a.at, total))
    return programs


def _block_data(op: str, M, actions, end: int) -> list:
    """One elementary range's program of a block collective, on rows of the range's elements:
    AllGather in place in the output, its block copied in first; ReduceScatter on a working
    copy of every block in the scratch (copied from the input first), its own block copied out
    last."""
    ranks = M.reshape(-1)
    p = ranks.size
    if _HALVES[op].gathers:
        # a data program's first step holds its LoopBody (hcomm.exec): each part has its own
        first = StepBuilder().copies(ranks, 1, INPUT, 0, 1, OUTPUT, ranks).build()
        return side_by_side(_placed([first], 0, end), *_moves(M, actions, OUTPUT, end))
    total = end + 1
    first = StepBuilder().copies(ranks, 1, INPUT, 0, p, SCRATCH, 0).build()
    last = StepBuilder().copies(ranks, 1, SCRATCH, ranks, ranks + 1, OUTPUT, 0).build()
    return side_by_side(_placed([first], 0, total), *_moves(M, actions, SCRATCH, total),
                        _placed([last], total - 1, total))


def _allreduce_data(M, actions, block: int, length: int, itemsize: int, total: int) -> list:
    """An AllReduce loop's data program over its `length` elements: the input copied to the
    output, then the ReduceScatter's and the AllGather's moves of every elementary range in
    place there, row r standing for elements [r * block, (r + 1) * block) clipped to the loop."""
    ranks = M.reshape(-1)
    first = StepBuilder().copies(ranks, 1, INPUT, 0, length, OUTPUT, 0).build()
    programs = [_placed([first], 0, total)]
    for lo, hi in _cuts(actions, block):
        inside = [a for a in actions if a.lo <= lo and hi <= a.hi]
        for st in _moves(M, inside, OUTPUT, total):
            programs.append([LazyStep(lambda s=s, lo=lo, hi=hi: _on_elements(s.full(), block, lo, hi, length, itemsize))
                             if isinstance(s, LazyStep) else s for s in st])
    return side_by_side(*programs)


def _on_elements(st, block: int, lo: int, hi: int, length: int, itemsize: int) -> GlobalStep:
    """A step on one-row blocks as a step on elements: row r becomes [r * block + lo, r * block
    + hi) clipped to `length`; what is left empty is dropped."""
    new = GlobalStep()
    for prefix, who in (("t_", "t_src"), ("c_", "c_rank")):
        n = len(getattr(st, who))
        if not n:
            continue
        cols = {name: np.asarray(getattr(st, name)) for name in ARRAYS if name.startswith(prefix)}
        keep = np.ones(n, dtype=bool)
        for side in ("s", "d", "r"):
            on = cols[f"{prefix}{side}buf"] >= 0
            a = np.minimum(cols[f"{prefix}{side}lo"] * block + lo, length)
            b = np.minimum(cols[f"{prefix}{side}lo"] * block + hi, length)
            cols[f"{prefix}{side}lo"] = np.where(on, a, cols[f"{prefix}{side}lo"])
            cols[f"{prefix}{side}hi"] = np.where(on, b, cols[f"{prefix}{side}hi"])
            keep &= ~on | (b > a)
        width = cols[f"{prefix}shi"] - cols[f"{prefix}slo"]
        cols[f"{prefix}bytes"] = width * itemsize
        for name, v in cols.items():
            setattr(new, name, v[keep])
    return new
