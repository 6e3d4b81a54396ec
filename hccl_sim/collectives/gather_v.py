"""The variable-size AllGather and ReduceScatter (HCCL's AllGatherV and ReduceScatterV): one count
per rank block, the same counts and displacements on every rank.

Both are held in the op's `VCounts` as AlltoAllV's pairs are: AllGatherV's rank i sends its
c_i elements to every rank j (counts[i, j] = c_i, landing at rdispls[j, i] = d_i), and
ReduceScatterV's rank i sends its block j (at d_j, c_j elements) to rank j, where every rank's
block j is reduced into the output (counts[i, j] = c_j, sdispls[i, j] = d_j). So their loops,
their checks of counts and the planner's per-loop programs are AlltoAllV's.

Loops as HCCL runs them in op-base mode (coll_all_gather_v_mesh_executor.cc,
coll_reduce_scatter_v_mesh_opbase_executor.cc): on one server every block is cut at the CCL
buffer's size (zero copy: each block moves straight between user buffers); across servers the
blocks share one CCL buffer, which each loop fills evenly ("每个块尽可能平分"): HCCL's
CalcCurCountsAndCurDisplsMultiModule gives every unfinished block the same share, so after loop k
block i has moved min(c_i, L_k), and loop k is the level range [L_{k-1}, L_k) of every block
(`shared_levels`).
"""
from __future__ import annotations

import numpy as np

from topologies.errors import Cause, HcclError

from hcomm.program import StepBuilder

from .base import Loops
from ..algorithms import hierarchy, registry, uneven
from . import verifiable as vf
from .variable import AllToAllV, PerLoop, VCounts, exclusive_sums

# HCCL's slice alignments (alg_template_base_pub.h): CCL-buffer loops are cut at multiples of these
HCCL_MIN_SLICE_ALIGN = 128                # bytes; the shared (multi-server) CCL buffer
HCCL_MIN_SLICE_ALIGN_910B = 16384         # bytes; AllGatherV's one-server loop leaves this much unused


class LoopRanges:
    """Loops of unequal lengths, by their bounds in every block's elements (the levels of a CCL
    buffer that all blocks share); iterates, indexes and measures as Loops does."""
    __slots__ = ("bounds",)

    def __init__(self, bounds):
        self.bounds = tuple(int(b) for b in bounds)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __iter__(self):
        return iter(zip(self.bounds[:-1], self.bounds[1:]))

    def __getitem__(self, i: int):
        return tuple(zip(self.bounds[:-1], self.bounds[1:]))[i]

    def __eq__(self, other):
        return isinstance(other, LoopRanges) and other.bounds == self.bounds

    def __hash__(self):
        return hash(self.bounds)

    def __repr__(self):
        return f"LoopRanges({list(self.bounds)})"

    @property
    def per(self) -> int:
        return self.bounds[-1]

    @property
    def extent(self) -> int:
        return max((b - a for a, b in self), default=0)

    cap = extent
    full = tail = 0        # no closed form: every loop is priced as a program of its own


def shared_levels(counts, total: int) -> LoopRanges:
    """The loops of blocks of `counts` elements sharing a CCL buffer of `total` elements per loop,
    as HCCL fills it: rounds giving every unfinished block an equal share (total // blocks left)
    until the buffer is full or a share would be zero. Block i has moved min(c_i, level) after
    each loop, since every unfinished block got the same shares."""
    left = np.asarray(counts, dtype=np.int64).copy()
    top = int(left.max(initial=0))
    bounds, level = [0], 0
    while (left > 0).any():
        room, before = total, level
        while room > 0:
            busy = int((left > 0).sum())
            share = room // busy if busy else 0
            if share == 0:
                break
            take = np.minimum(left, share)
            room -= int(take.sum())
            left -= take
            level += share
        if level == before:
            raise HcclError("E_PARA", f"the CCL buffer ({total} elements) is smaller than the {int((left > 0).sum())} "
                            "blocks still to move: raise HCCL_BUFFSIZE")
        bounds.append(min(level, top))
    return LoopRanges(bounds)


def agreed(locals_: list, names: tuple, op: str) -> tuple:
    """Every rank's (counts, displacements) when they agree, else E_PARA on every rank naming the
    first rank and index that differ from rank 0's."""
    first = locals_[0]
    for r, row in enumerate(locals_[1:], 1):
        for k, (mine, theirs) in enumerate(zip(row, first)):
            if mine != theirs:
                j = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
                raise HcclError("E_PARA", f"{op}: rank {r} gives {names[k]}[{j}] = {mine[j]}, rank 0 gives "
                                f"{theirs[j]} ({names[k]} must be the same on every rank)", cause=Cause.MISMATCH,
                                peers=(0, r))
    return first


class _OneCountPerBlock(AllToAllV):
    """What AllGatherV and ReduceScatterV share: the counts every rank gives alike, loops as HCCL's
    V executors cut them, and staging whose copies the programs make themselves where they must
    (a layout that is not the blocks end to end)."""
    max_ranks_with_data = None
    stages_itself = True

    def selection_signature(self, sig):
        """HCCL's V operators size their selection by the largest block (SelectAlgfor910B:
        dataSize = maxCount x unit): AllGather's per-rank input, ReduceScatter's per-rank output."""
        top = int(self.block_counts(sig.v).max(initial=0)) if sig.v is not None else 0
        scale = sig.v.size if self.selects_as == "reducescatter" and sig.v is not None else 1
        return sig._replace(shape=(top * scale,), v=None, local=None)

    counts_ndim = 1         # a call's counts in one array: the p block counts

    def vcounts_of(self, counts):
        return self.vcounts(counts, exclusive_sums(counts))

    def call_counts(self, counts, rank):
        return (counts,)

    def loops_of(self, sig, p, itemsize, buffsize, modules: int = 1):
        counts = self.block_counts(sig.v)
        if modules > 1:
            return PerLoop(shared_levels(counts, max(1, buffsize // HCCL_MIN_SLICE_ALIGN * HCCL_MIN_SLICE_ALIGN
                                                     // itemsize)), sig.v)
        return PerLoop(Loops(int(counts.max(initial=0)), max(1, self.one_server_loop_bytes(buffsize) // itemsize)),
                       sig.v)

    def one_server_loop_bytes(self, buffsize: int) -> int:
        return buffsize // HCCL_MIN_SLICE_ALIGN * HCCL_MIN_SLICE_ALIGN

    def busbw_factor(self, p):
        return (p - 1) / p

    def v_program(self, choice, view, v, a, b, itemsize):
        """Loop [a, b): the block algorithm selection chose, on the loop's blocks
        (algorithms.uneven), with HCCL's staging around it on presets that stage."""
        lengths = np.clip(self.block_counts(v) - a, 0, b - a)
        user_lo = self.block_displs(v) + a
        p = len(lengths)
        if choice.flat or p == 1:       # one rank: a copy, as the full mesh makes it, whatever the levels
            level1 = choice.level1 if choice.flat else "fullmesh"
            run = self.flat_run(registry.module(level1), p, itemsize)
            anywhere = level1 in ("ring", "fullmesh")               # they take blocks anywhere
        else:
            srv = view.servers
            anywhere = srv.m <= 1                                   # level0 alone: the mesh or the ring
            run = self.level_run(srv, itemsize, choice.level0 or "fullmesh", choice.level1 or "ring")
        program, in_place = self.uneven_program(lengths, user_lo, a, itemsize, run, anywhere)
        if view.staging:
            ins, outs = self.stage_bytes_v(v, a, b, itemsize, view.servers.m, in_place)
            program = _staged(program, ins, outs)
        return program

    def v_staging(self, v, a, b, itemsize):
        return None             # the program stages itself (v_program)


def _staged(program, ins, outs) -> list:
    """The program between its CCL-buffer copies: `ins` bytes per rank before, `outs` after."""
    r = np.arange(len(ins))
    before = [StepBuilder().stages(r[ins > 0], ins[ins > 0], "in").build()] if (ins > 0).any() else []
    after = [StepBuilder().stages(r[outs > 0], outs[outs > 0], "out").build()] if (outs > 0).any() else []
    return before + list(program) + after


class AllGatherV(_OneCountPerBlock):
    """HcclAllGatherV: rank i's x (recv_counts[i] rows) lands at recv_displs[i] in every rank's
    result; every rank gives the same counts and displacements."""
    name, method = "allgatherv", "all_gather_v"
    selects_as = "allgather"
    level_run = staticmethod(hierarchy.allgather_blocks)
    uneven_program = staticmethod(uneven.allgatherv)

    @staticmethod
    def flat_run(mod, p, itemsize):
        def run(buf, offs):
            return mod.allgather(p, offs, itemsize, buf)
        return run
    names = ("recv_counts", "recv_displs")

    @staticmethod
    def vcounts(counts, displs) -> VCounts:
        counts, displs = np.asarray(counts, dtype=np.int64), np.asarray(displs, dtype=np.int64)
        p = len(counts)
        return VCounts(np.repeat(counts[:, None], p, axis=1), np.zeros((p, p), dtype=np.int64),
                       np.repeat(displs[None, :], p, axis=0))

    @staticmethod
    def block_counts(v: VCounts) -> np.ndarray:
        return v.counts[:, 0] if v.size else v.counts.sum(axis=1)

    @staticmethod
    def block_displs(v: VCounts) -> np.ndarray:
        return v.rdispls[0] if v.size else v.counts.sum(axis=1)

    def merged(self, locals_, row_elems):
        counts, displs = agreed(locals_, self.names, self.method)
        return self.vcounts(np.array(counts) * row_elems, np.array(displs) * row_elems)

    def one_server_loop_bytes(self, buffsize):
        # CalcLoopMaxCount of the mesh executor on one module: 16 KiB of the buffer left unused
        return max(HCCL_MIN_SLICE_ALIGN_910B, (buffsize - HCCL_MIN_SLICE_ALIGN_910B) // HCCL_MIN_SLICE_ALIGN_910B
                   * HCCL_MIN_SLICE_ALIGN_910B)

    def bytes_of(self, sig, p, itemsize):
        return int(self.block_counts(sig.v).sum()) * itemsize      # the whole gathered output, as AllGather

    def input_rows(self, counts, rank):
        return int(counts[rank])

    def output_rows(self, counts, rank):
        return int(np.sum(counts))

    def verifiable_v(self, counts, rank, dtype, redop="sum"):
        return np.concatenate([vf.values(np.arange(int(c)), i, dtype, redop) for i, c in enumerate(counts)]) \
            if len(counts) else np.empty(0)

    def stage_bytes_v(self, v, a, b, itemsize, modules=1, in_place=True):
        """(in, out) bytes each rank stages for loop [a, b) beyond what its program copies: across
        servers HCCL copies the rank's block into the CCL buffer and every gathered block back
        out (coll_all_gather_v_executor.cc RunLoop); on one server it copies nothing."""
        p = v.size
        if modules <= 1:
            zero = np.zeros(p, dtype=np.int64)
            return zero, zero.copy()
        lengths = np.clip(self.block_counts(v) - a, 0, b - a) * itemsize
        return lengths.copy(), np.full(p, int(lengths.sum()) if in_place else 0, dtype=np.int64)


class ReduceScatterV(_OneCountPerBlock):
    """HcclReduceScatterV: block j of every rank's x (send_counts[j] rows at send_displs[j]) is
    reduced into rank j's result; every rank gives the same counts and displacements."""
    name, method = "reducescatterv", "reduce_scatter_v"
    selects_as = "reducescatter"
    reducing = True
    inline_only = True              # reduce_scatter_v_operator.cc (docs/references.md §6.9)
    level_run = staticmethod(hierarchy.reducescatter_blocks)
    uneven_program = staticmethod(uneven.reducescatterv)

    @staticmethod
    def flat_run(mod, p, itemsize):
        def run(src, offs, acc, out, out_lo):
            return mod.reducescatter(p, offs, itemsize, src, acc, out, out_lo)
        return run
    names = ("send_counts", "send_displs")

    @staticmethod
    def vcounts(counts, displs) -> VCounts:
        counts, displs = np.asarray(counts, dtype=np.int64), np.asarray(displs, dtype=np.int64)
        p = len(counts)
        return VCounts(np.repeat(counts[None, :], p, axis=0), np.repeat(displs[None, :], p, axis=0),
                       np.zeros((p, p), dtype=np.int64))

    @staticmethod
    def block_counts(v: VCounts) -> np.ndarray:
        return v.counts[0] if v.size else v.counts.sum(axis=0)

    @staticmethod
    def block_displs(v: VCounts) -> np.ndarray:
        return v.sdispls[0] if v.size else v.counts.sum(axis=0)

    def merged(self, locals_, row_elems):
        counts, displs = agreed(locals_, self.names, self.method)
        return self.vcounts(np.array(counts) * row_elems, np.array(displs) * row_elems)

    def bytes_of(self, sig, p, itemsize):
        return int(self.block_counts(sig.v).sum()) * itemsize      # the whole input, as ReduceScatter

    def input_rows(self, counts, rank):
        return int(np.sum(counts))

    def output_rows(self, counts, rank):
        return int(counts[rank])

    def verifiable_v(self, counts, rank, dtype, redop="sum"):
        start = int(np.sum(counts[:rank]))
        return vf.reduced(np.arange(start, start + int(counts[rank])), len(counts), dtype, redop)

    def stage_bytes_v(self, v, a, b, itemsize, modules=1, in_place=True):
        """(in, out) bytes each rank stages for loop [a, b) beyond what its program copies: across
        servers HCCL copies every block into the CCL buffer and the rank's reduced block back out
        (coll_reduce_scatter_v_executor.cc RunLoopInner); on one server it copies nothing."""
        p = v.size
        if modules <= 1:
            zero = np.zeros(p, dtype=np.int64)
            return zero, zero.copy()
        lengths = np.clip(self.block_counts(v) - a, 0, b - a) * itemsize
        return np.full(p, int(lengths.sum()) if in_place else 0, dtype=np.int64), lengths.copy()

    def reference_v(self, inputs, v: VCounts, out_rows: list, row_shape: tuple, redop=None):
        from .fixed import _reduce_all
        counts, displs = self.block_counts(v), self.block_displs(v)
        flats = [x.reshape(-1) for x in inputs]
        outs = []
        for j in range(len(inputs)):
            part = _reduce_all([f[displs[j]:displs[j] + counts[j]] for f in flats], redop)
            outs.append(part.reshape((int(out_rows[j]),) + tuple(row_shape)))
        return outs


def default_displs(counts) -> np.ndarray:
    """HCCL's displacements when none are given: blocks end to end in rank order."""
    return exclusive_sums(np.asarray(counts, dtype=np.int64))
