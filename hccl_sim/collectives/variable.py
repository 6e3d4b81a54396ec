"""Variable-size collectives: every pair of ranks moves a count of its own (HCCL's AlltoAllV and
AlltoAllVC), with HCCL's count and displacement semantics.

A call gives counts and displacements in rows along axis 0 (a row is x.shape[1:]); the op moves
elements. Every rank knows only its own row of the count matrix (what it sends to each peer, what
it expects from each): the rendezvous stacks the rows (`merge`) into the op's `VCounts`, which the
plan, its programs and its caches key on, and finds a pair whose counts disagree there, on every
rank. AlltoAllVC gives the whole matrix on every rank, so its calls agree as they are.

Loops: as HCCL's AlltoAll in op-base mode, every pair's block is moved through the CCL buffer in
slices of at most HCCL_BUFFSIZE / (p x itemsize) elements; loop k moves elements [a, b) of every
block that still has them. Programs address each rank's buffers at absolute offsets (flat layout,
a loop's view is the whole buffer), so a loop's program depends on where it starts, not only on
its length.
"""
from __future__ import annotations

import math

import numpy as np

from hcomm.program import SCRATCH
from topologies.errors import Cause, HcclError

from .base import Collective, Loops
from ..algorithms import grouped_mesh, hierarchy, mesh, mesh_rounds, pairwise
from .fixed import MAX_ALLTOALL_RANKS, AllToAll
from . import verifiable as vf

_I64 = np.int64


class VCounts:
    """Per-pair element counts and displacements of a variable-size op, hashable by content.

    counts[i, j]: elements rank i sends to rank j; sdispls[i, j]: where they start in rank i's
    input; rdispls[j, i]: where they land in rank j's output (element offsets)."""
    __slots__ = ("counts", "sdispls", "rdispls", "_key", "_hash")

    def __init__(self, counts, sdispls, rdispls):
        self.counts = np.ascontiguousarray(counts, dtype=_I64)
        self.sdispls = np.ascontiguousarray(sdispls, dtype=_I64)
        self.rdispls = np.ascontiguousarray(rdispls, dtype=_I64)
        for a in (self.counts, self.sdispls, self.rdispls):
            a.setflags(write=False)
        self._key = self.counts.tobytes() + self.sdispls.tobytes() + self.rdispls.tobytes()
        self._hash = hash((len(self.counts), self._key))

    @classmethod
    def contiguous(cls, counts) -> "VCounts":
        """Blocks laid out in rank order on both sides (HCCL's default displacements)."""
        counts = np.asarray(counts, dtype=_I64)
        return cls(counts, exclusive_sums(counts), exclusive_sums(counts.T))

    @property
    def size(self) -> int:
        return len(self.counts)

    def __eq__(self, other):
        return isinstance(other, VCounts) and other._key == self._key

    def __hash__(self):
        return self._hash

    def __reduce__(self):
        return VCounts, (self.counts, self.sdispls, self.rdispls)

    def __repr__(self):
        return f"VCounts(p={self.size}, {int(self.counts.sum())} elements)"

    def input_elements(self) -> np.ndarray:
        """Elements each rank's input must hold (the end of its last send block)."""
        return _ends(self.sdispls, self.counts)

    def output_elements(self) -> np.ndarray:
        """Elements of each rank's output (the end of its last receive block)."""
        return _ends(self.rdispls, self.counts.T)

    def sent(self) -> np.ndarray:
        """Elements each rank sends, its own block included."""
        return self.counts.sum(axis=1)


def exclusive_sums(counts) -> np.ndarray:
    """Row-wise exclusive prefix sums: the displacements of blocks laid end to end in rank order."""
    counts = np.asarray(counts, dtype=_I64)
    out = np.zeros_like(counts)
    if counts.size:
        np.cumsum(counts[..., :-1], axis=-1, out=out[..., 1:])
    return out


def _ends(displs, counts) -> np.ndarray:
    ends = np.where(counts > 0, displs + counts, 0)
    return ends.max(axis=1) if ends.size else np.zeros(len(counts), dtype=_I64)


# ---- a rank's own counts, checked as HCCL checks them ---------------------------------------------

def _vector(values, p: int, what: str, rank: int, op: str) -> np.ndarray:
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError):      # ragged or not a sequence: said below
        arr = None
    integers = arr is not None and (arr.dtype.kind in "iu" or (
        arr.dtype.kind == "O" and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in arr)))
    if arr is None or arr.ndim != 1 or len(arr) != p or not integers:
        raise HcclError("E_PARA", f"{what} must be {p} integers (one per rank), got {values!r}", rank=rank, op=op,
                        cause=Cause.BAD_INPUT)
    arr = arr.astype(_I64)
    bad = np.flatnonzero(arr < 0)
    if len(bad):
        raise HcclError("E_PARA", f"{what}[{int(bad[0])}] = {int(arr[bad[0]])} is negative", rank=rank, op=op,
                        cause=Cause.BAD_INPUT)
    return arr


def blocks(counts, displs, p: int, side: str, rank: int, op: str, rows=None) -> tuple:
    """(counts, displacements) of one rank's blocks on one side ("send" or "recv"), checked:
    p non-negative integers each, blocks that do not overlap and, with `rows`, that end within
    the buffer's rows. Default displacements lay the blocks end to end in rank order."""
    counts = _vector(counts, p, f"{side}_counts", rank, op)
    if displs is None:
        displs = exclusive_sums(counts)
    else:
        displs = _vector(displs, p, f"{side}_displs", rank, op)
        used = np.flatnonzero(counts > 0)
        order = used[np.argsort(displs[used], kind="stable")]
        ends = displs[order] + counts[order]
        clash = np.flatnonzero(displs[order][1:] < ends[:-1])
        if len(clash):
            a, b = int(order[clash[0]]), int(order[clash[0] + 1])
            raise HcclError("E_PARA", f"{side}_displs: the block for rank {b} ({side}_displs[{b}] = {int(displs[b])}) "
                            f"overlaps the block for rank {a} (rows {int(displs[a])}..{int(displs[a] + counts[a]) - 1})",
                            rank=rank, op=op, cause=Cause.BAD_INPUT)
    if rows is not None:
        over = np.flatnonzero((counts > 0) & (displs + counts > rows))
        if len(over):
            j = int(over[0])
            raise HcclError("E_PARA", f"{side}_displs[{j}] + {side}_counts[{j}] = {int(displs[j] + counts[j])} rows "
                            f"is past the {'input' if side == 'send' else 'output'}'s {rows} rows", rank=rank, op=op,
                            cause=Cause.BAD_INPUT)
    return counts, displs


def merge(locals_: list, row_elems: int, what: str) -> VCounts:
    """The op's VCounts from every rank's own (send counts, send displacements, receive counts,
    receive displacements), in rows, rank order; E_PARA naming both ranks and both counts when a
    rank sends a peer other than what the peer expects from it."""
    send = np.array([l[0] for l in locals_], dtype=_I64)
    recv = np.array([l[2] for l in locals_], dtype=_I64)
    wrong = np.argwhere(send != recv.T)
    if len(wrong):
        i, j = (int(v) for v in wrong[0])
        raise HcclError("E_PARA", f"{what}: rank {i} sends {int(send[i, j])} rows to rank {j}, which expects "
                        f"{int(recv[j, i])} rows from rank {i} (send_counts and recv_counts disagree)",
                        cause=Cause.MISMATCH, peers=(i, j))
    sd = np.array([l[1] for l in locals_], dtype=_I64)
    rd = np.array([l[3] for l in locals_], dtype=_I64)
    return VCounts(send * row_elems, sd * row_elems, rd * row_elems)


def _scratch_end(program) -> int:
    """Elements of the scratch area a flat program addresses (0: none)."""
    end = 0
    for step in program:
        step = step.full()
        for buf, hi in ((step.t_dbuf, step.t_dhi), (step.c_dbuf, step.c_dhi)):
            hit = np.asarray(buf) == SCRATCH
            if hit.any():
                end = max(end, int(np.asarray(hi)[hit].max()))
    return end


class PerLoop:
    """A variable-size op's loops (`loops`: Loops, or gather_v.LoopRanges of unequal lengths):
    each loop's program depends on where it starts (which rows of every block it moves), so each
    is keyed by its range, built with the op's counts `v`, and priced one by one (no closed form).
    Iterates, indexes and measures as its loops do."""
    __slots__ = ("loops", "v")
    closed_form = False

    def __init__(self, loops, v):
        self.loops, self.v = loops, v

    def __len__(self) -> int:
        return len(self.loops)

    def __iter__(self):
        return iter(self.loops)

    def __getitem__(self, i: int):
        return self.loops[i]

    def with_cap(self, cap: int) -> "PerLoop":
        """The same op's loops `cap` elements of every block at a time."""
        return PerLoop(self.loops.with_cap(cap), self.v)

    def __eq__(self, other):
        return isinstance(other, PerLoop) and other.loops == self.loops

    def __hash__(self):
        return hash(self.loops)

    def __repr__(self):
        return f"PerLoop({self.loops!r})"

    per = property(lambda self: self.loops.per)
    extent = property(lambda self: self.loops.extent)
    cap = property(lambda self: self.loops.cap)
    full = tail = 0

    def key(self, a: int, b: int):
        return (a, b)

    def uses(self) -> list:
        return [((a, b), 1) for a, b in self.loops]

    def build(self, key, builder):
        a, b = key
        return builder.variable(self.v, a, b)

    def no_programs(self) -> dict:
        return {(0, 0): []}


class AllToAllV(Collective):
    """HcclAlltoAllV: rank i sends send_counts[j] rows, from send_displs[j], to rank j, which
    receives them at its recv_displs[i]. The result holds the received rows in rank order (at
    the receive displacements)."""
    name, method = "alltoallv", "all_to_all_v"
    variable, min_ndim = True, 1
    eager = False                   # each rank's input has a shape of its own
    selects_as = "alltoall"
    max_ranks_with_data = AllToAll.max_ranks_with_data     # p(p-1) blocks moved one by one, as AlltoAll's

    def loops_of(self, sig, p, itemsize, buffsize, modules=1):
        per = int(sig.v.counts.max()) if sig.v.counts.size else 0
        return PerLoop(Loops(per, max(1, buffsize // (p * itemsize))), sig.v)

    def buffer_bytes(self, sig, p, itemsize):
        return self.bytes_of(sig, p, itemsize)

    def bytes_of(self, sig, p, itemsize):
        return int(sig.v.counts.sum(axis=1).max()) * itemsize if p else 0     # the largest send buffer

    # ---- a call's counts in one array (simulate, bench, chaos): here the p x p matrix ----------
    counts_ndim = 2

    def vcounts_of(self, counts) -> VCounts:
        """The op's VCounts from its counts in elements, blocks end to end (default displacements)."""
        return VCounts.contiguous(counts)

    def call_counts(self, counts, rank: int) -> tuple:
        """The Communicator method's count arguments on `rank`."""
        return (counts[rank], counts[:, rank])

    def input_rows(self, counts, rank: int) -> int:
        return int(counts[rank].sum())

    def output_rows(self, counts, rank: int) -> int:
        return int(counts[:, rank].sum())

    def verifiable_v(self, counts, rank: int, dtype: str, redop="sum"):
        """Rank `rank`'s result when every rank r's input is verifiable.rank_input(r, its rows)."""
        start = exclusive_sums(counts)
        return np.concatenate([vf.values(np.arange(start[i, rank], start[i, rank] + counts[i, rank]), i, dtype, redop)
                               for i in range(len(counts))]) if len(counts) else np.empty(0)

    def merged(self, locals_, row_elems) -> VCounts:
        """The op's VCounts from every rank's `local` rows (see `merge`)."""
        return merge(locals_, row_elems, self.method)

    def merged_signatures(self, signatures: list) -> list:
        """Every rank's rows of counts (its signature's `local`) merged into the op's VCounts (`v`),
        E_PARA naming both ranks and both counts where a pair disagrees; calls that differ
        otherwise are left as they are, without their rows, for the mismatch check to name."""
        first = signatures[0]
        if first.local is None or any(s.local is None for s in signatures):
            return signatures
        common = [s._replace(local=None) for s in signatures]
        if any(c != common[0] for c in common):
            return common
        v = self.merged([s.local for s in signatures], math.prod(first.shape))
        return [common[0]._replace(v=v)] * len(signatures)

    def input_of(self, x, counts, rank):
        return x[:self.input_rows(counts, rank)]

    def output_shape_of(self, x, p, counts, rank):
        return (self.output_rows(counts, rank),)

    def references(self, inputs, counts, redop=None, root=0):
        rows = [self.output_rows(counts, r) for r in range(len(inputs))]
        return self.reference_v(inputs, self.vcounts_of(counts), rows, (), redop)

    def size_args(self, split, p, elements, itemsize):
        return {"counts": self.counts_for(split, p, elements)}

    def counts_for(self, split, p, elements):
        """AlltoAllV's p x p matrix (`elements`: each rank's send buffer), AllGatherV's and
        ReduceScatterV's p block counts (`elements`: the whole output, the whole input)."""
        return split.matrix(p, elements) if self.counts_ndim == 2 else split.vector(p, elements)

    def simulated_size(self, nbytes, counts, p, itemsize):
        """simulate() of a variable-size op takes `counts` in elements, not nbytes: AlltoAllV's
        p x p matrix, AllGatherV's and ReduceScatterV's p block counts (`counts_ndim`)."""
        if p > MAX_ALLTOALL_RANKS:
            raise HcclError("E_PARA", f"simulate {self.name}: {p} ranks are over the limit of {MAX_ALLTOALL_RANKS} "
                            "(hccl_sim.MAX_ALLTOALL_RANKS): its blocks are held as a p x p count matrix")
        if nbytes is not None:
            raise HcclError("E_PARA", f"simulate {self.name}: give counts= (elements), not nbytes")
        shape, what = ((p, p), f"a {p} x {p} matrix of non-negative integers (elements rank i sends to rank j)") \
            if self.counts_ndim == 2 else ((p,), f"{p} non-negative integers (elements of each rank's block)")
        try:
            matrix = np.asarray(counts)
            ok = matrix.shape == shape and matrix.dtype.kind in "iu" and not (matrix < 0).any()
        except (TypeError, ValueError):      # ragged or not numbers: said below
            ok = False
        if not ok:
            raise HcclError("E_PARA", f"simulate {self.name}: counts must be {what}, got {counts!r}")
        return (), self.vcounts_of(matrix.astype(np.int64))

    def describe_counts(self, sig) -> list:
        if sig.local is not None:
            return [f"send_counts={list(sig.local[0])}, recv_counts={list(sig.local[2])}"]
        if sig.v is not None:
            return [f"{int(sig.v.counts.sum())} elements between {sig.v.size} ranks"]
        return []

    def layout(self, p):
        return (0, 0, 0)

    def scratch_shape_of(self, sig, p, loops):
        return None

    def data_loops(self, sig, p, loops, loop_programs):
        # programs address whole flat buffers at absolute offsets: every loop's view is all of them,
        # and the scratch area is what the programs address of it
        programs = [program for _, program in loop_programs]
        scratch = max((_scratch_end(program) for program in programs), default=0)
        whole = max(self.whole(sig), scratch)
        return tuple((0, whole, program) for program in programs), ((scratch,) if scratch else None)

    def whole(self, sig) -> int:  # noqa: D401
        """Elements a loop's view spans: every rank's whole buffers."""
        v = sig.v
        return int(max(v.input_elements().max(initial=0), v.output_elements().max(initial=0), 1))

    def round_blocks(self, v: VCounts, a: int, b: int) -> tuple:
        """(lengths, send offsets, receive offsets) of every pair's part of loop [a, b): element
        [a, b) of each block that has them; lengths[i, j] and send offsets [i, j] by sender,
        receive offsets [i, j] by sender too (rank j's output)."""
        lengths = np.clip(v.counts - a, 0, b - a)
        return lengths, v.sdispls + a, v.rdispls.T + a

    def stage_bytes_v(self, v: VCounts, a: int, b: int, itemsize: int) -> tuple:
        """(in, out) bytes each rank stages for loop [a, b), as AlltoAll's trace shows it: the
        loop's whole send data copied in, its own block into the output."""
        lengths, _, _ = self.round_blocks(v, a, b)
        return lengths.sum(axis=1) * itemsize, np.diagonal(lengths).copy() * itemsize

    # ---- how a loop's program is built (hccl_sim.plan.loop_programs asks) ----------------------
    def v_program(self, choice, view, v: VCounts, a: int, b: int, itemsize: int) -> list:
        """The program of loop [a, b) (view: plan.loop_programs.Levels): the algorithm selection
        chose for the collective it follows, each pair moving its own count. Unstaged: the plan
        adds `v_staging` around it."""
        blocks = self.round_blocks(v, a, b)
        if choice.flat:
            if choice.level1 == "grouped_fullmesh":
                return grouped_mesh.alltoallv(view.sdma_groups, blocks, itemsize)
            if choice.level1 == "fullmesh":
                return mesh.alltoallv(blocks, itemsize)
            if choice.level1 == mesh_rounds.NAME:
                return mesh_rounds.alltoallv(blocks, itemsize)
            return pairwise.alltoallv(blocks, itemsize)
        return hierarchy.alltoallv(view.servers, blocks, itemsize)

    def v_staging(self, v: VCounts, a: int, b: int, itemsize: int):
        """(in, out) bytes each rank stages around loop [a, b) on presets that stage, or None where
        the program carries its own staging (AllGatherV, ReduceScatterV)."""
        return self.stage_bytes_v(v, a, b, itemsize)

    def busbw_factor(self, p):
        return (p - 1) / p

    def reference_v(self, inputs, v: VCounts, out_rows: list, row_shape: tuple, redop=None):
        """Every rank's expected result (numpy, rows) from every rank's input."""
        p = len(inputs)
        outs = []
        for j in range(p):
            flat = np.zeros(int(out_rows[j]) * int(np.prod(row_shape, dtype=_I64)), dtype=inputs[0].dtype)
            for i in range(p):
                n, s, d = v.counts[i, j], v.sdispls[i, j], v.rdispls[j, i]
                flat[d:d + n] = inputs[i].reshape(-1)[s:s + n]
            outs.append(flat.reshape((int(out_rows[j]),) + tuple(row_shape)))
        return outs


class AllToAllVC(AllToAllV):
    """HcclAlltoAllVC: every rank gives the whole count matrix (count_matrix[i][j]: rows rank i
    sends to rank j); blocks are laid out in rank order on both sides."""
    name, method = "alltoallvc", "all_to_all_vc"

    def call_counts(self, counts, rank):
        return (counts,)
