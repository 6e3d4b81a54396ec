"""The collective registry: what each collective *is*, in one class per collective.

Everything about a collective that is not an algorithm lives here, and every other part reads it
(the Communicator, the planner, the data planes of every engine, bench, verifiable inputs, the
tests): its names (HCCL/nccl-tests spelling and the Communicator method), the shape of its result,
how its buffers are laid out for a schedule (whole vectors, or rows of rank blocks), the CCL-buffer
loops of op-base mode, the scratch area a schedule may use, the bytes staged in and out of the CCL
buffer, nccl-tests' size and bus-bandwidth factor, and a numpy reference result. Adding Gather,
Scatter or a V variant is one class here plus the algorithms that build it (cf. msccl-tools'
`Collective`, nccl-tests' `testColl`).

Layouts: a *vector* collective (AllReduce, Broadcast, Reduce) schedules elements of one vector;
a *block* collective (AllGather, ReduceScatter, AlltoAll) schedules p rank blocks, and a loop takes
the same element range [a, b) of every block.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from topologies.errors import HcclError

from . import verifiable as vf
from ..config.types import ReduceOp

# An op whose per-rank buffer is larger than this cannot be priced in int64 nanoseconds at the
# slowest link rates (2^56 B at 20 GB/s is ~3.6e18 ns, near int64's 9.2e18); real HCCL counts are
# uint64, so this is an emulator limit, stated in the error.
MAX_OP_BYTES = 1 << 56


@dataclass(frozen=True)
class Loops:
    """The CCL-buffer loops of an op: `per` elements (per block for block collectives) processed
    `cap` at a time. Kept in closed form, so a 2^50-byte op is two numbers, not millions of ranges."""
    per: int
    cap: int

    def __len__(self) -> int:
        return -(-self.per // self.cap) if self.per else 0

    @property
    def full(self) -> int:
        """How many loops hold exactly `cap` elements."""
        return self.per // self.cap

    @property
    def tail(self) -> int:
        """Elements of the last, partial loop (0 when every loop is full)."""
        return self.per % self.cap

    @property
    def extent(self) -> int:
        """Elements of the largest loop (what a scratch area must hold)."""
        return min(self.per, self.cap)

    def __iter__(self):
        for a in range(0, self.per, self.cap):
            yield a, min(a + self.cap, self.per)

    def __getitem__(self, i: int):
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        a = i * self.cap
        return a, min(a + self.cap, self.per)


class Collective:
    """Base of every collective. Subclasses set the class attributes and override what differs."""
    name: str = ""              # HCCL / nccl-tests name: "allreduce"
    method: str = ""            # the Communicator method: "all_reduce"
    block: bool = False         # schedules rank blocks (True) or one vector (False)
    reducing: bool = False      # takes a reduce op
    rooted: bool = False        # takes a root
    min_ndim: int = 0           # inputs need at least this many dimensions
    divisible: bool = False     # input's first dimension must be divisible by the rank count
    has_scratch: bool = False   # its schedules use the communicator's scratch area
    carries_data: bool = True
    max_ranks_with_data = None  # most ranks it may run on with real data (None: no limit of its own)
    variable: bool = False      # every pair moves a count of its own (collectives.variable)
    selects_as: Optional[str] = None    # the collective whose selection and HCCL_ALGO setting it follows
    stages_itself: bool = False     # its programs carry their own CCL-buffer staging (AllGatherV, ReduceScatterV)
    not_on: tuple = ()              # devices HCCL does not run it on

    def __repr__(self):
        return f"<collective {self.name}>"

    # ---- calls -------------------------------------------------------------------------------
    def check_input(self, shape: tuple, p: int) -> Optional[str]:
        """None if an input of `shape` is valid on p ranks, else what is wrong."""
        if len(shape) < self.min_ndim:
            return f"input must have at least {self.min_ndim} dimension(s), got shape {shape}"
        if self.divisible and shape[0] % p:
            return (f"input's first dimension ({shape[0]}) must be divisible by the number of ranks ({p})")
        return None

    def output_shape(self, shape: tuple, p: int) -> tuple:
        return tuple(shape)

    def result(self, out, rank: int, root: Optional[int]):
        """What the call returns on `rank`."""
        return out

    # ---- sizes -------------------------------------------------------------------------------
    def op_bytes(self, count: int, p: int, itemsize: int) -> int:
        """The op's size as nccl-tests counts it, for a per-rank input of `count` elements."""
        return count * itemsize

    def count_for_bytes(self, nbytes: int, p: int, itemsize: int) -> int:
        """nccl-tests' element count of the op's buffer for a size in bytes (block ops round to p)."""
        count = nbytes // itemsize
        return count - count % p if self.block else count

    def input_shape_for_bytes(self, nbytes: int, p: int, itemsize: int) -> tuple:
        """Each rank's input shape for an op of `nbytes` (nccl-tests sizing)."""
        return (self.count_for_bytes(nbytes, p, itemsize),)

    def busbw_factor(self, p: int) -> float:
        """nccl-tests' bus-bandwidth factor (PERFORMANCE.md)."""
        return 1.0

    # ---- what a call's signature implies (variable-size collectives override these) -------------
    def loops_of(self, sig, p: int, itemsize: int, buffsize: int, modules: int = 1) -> "Loops":
        """The CCL-buffer loops of the call `sig` (a planner.Signature) on `modules` servers."""
        return self.loops(sig.count if self.carries_data else 0, p, itemsize, buffsize)

    def bytes_of(self, sig, p: int, itemsize: int) -> int:
        """The call's size as nccl-tests counts it."""
        return self.op_bytes(sig.count, p, itemsize) if self.carries_data else 0

    def scratch_shape_of(self, sig, p: int, loops: "Loops"):
        return self.scratch_shape(p, loops)

    def group_volume(self, nbytes: int, p: int) -> int:
        """The data volume a group sorts it by (HCCL's calcOpDataVolume), from its input's bytes."""
        return nbytes

    def selection_signature(self, sig):
        """The call as the selection of the collective it follows sizes it (itself, for most)."""
        return sig

    def selection_name(self) -> str:
        """The collective whose selection (and HCCL_ALGO setting) this one follows: its own, or
        HCCL's parser's choice for a variant (AlltoAllV follows `alltoall`)."""
        return self.selects_as or self.name

    # ---- layout of a schedule's buffers ----------------------------------------------------------
    def loops(self, count: int, p: int, itemsize: int, buffsize: int) -> Loops:
        """op-base mode: data larger than the CCL buffer is processed in buffer-sized loops."""
        if self.block:
            per = count if self.name == "allgather" else count // p
            return Loops(per, max(1, buffsize // (p * itemsize)))
        return Loops(count, max(1, buffsize // itemsize))

    def program_unit(self, length: int, itemsize: int) -> int:
        """Bytes of one schedule unit: an element (vector ops) or a loop's block (block ops)."""
        return length * itemsize if self.block else itemsize

    def scratch_shape(self, p: int, loops: Loops):
        """The communicator-buffer area a schedule may use, or None; each loop has columns of its
        own, so workers sharing an op never race across loops."""
        return (p, loops.per) if self.has_scratch and len(loops) else None

    def layout(self, p: int) -> tuple:
        """How a loop's schedule sees (input, output, scratch): 0 a flat vector (a loop takes
        elements [a, b)), k the array as k rows (a loop takes columns [a, b) of every row), None
        absent. What the data program's views are cut by (hcomm.exec.DataProgram)."""
        return (0, 0, None) if self.carries_data else (None, None, None)

    def stage_bytes(self, p: int, length: int, itemsize: int, root: int):
        """(in, out): bytes each rank copies between its user buffers and the CCL buffer before and
        after one loop's schedule (op-base mode, presets that stage).

        What HCCL copies is what its msprof traces of 8 x 910B show (docs/references.md §4.7: the
        ascend.cl traces, HCCL_BUFFSIZE=2048): peers read the user's data in place wherever the
        schedule allows, so most collectives copy one block, not the whole buffer. Copies the
        traces place between phases (AllReduce's, Reduce's) are charged after the schedule: on
        symmetric schedules the time is the same. Only single-server (mesh) schedules were traced.

        This default, for a collective no trace describes, copies the loop's whole vector (or one
        block) in and out; every collective defined here overrides it with what its trace shows."""
        vec = np.full(p, length * itemsize, dtype=np.int64)
        return vec, vec.copy()

    # Each subclass defines reference(inputs, redop=None, root=0) -> list: every rank's expected
    # result from every rank's input (numpy, in rank order), and verifiable(rank, p, count, dtype,
    # redop, root): rank's expected result when every rank's input is hccl_sim.collectives.verifiable's pattern
    # of `count` elements, computed without the other ranks' data.


def _reduce_all(inputs, redop):
    from ..config.types import reducer
    acc = np.array(inputs[0], copy=True)
    fn = reducer(redop or ReduceOp.SUM)
    for x in inputs[1:]:
        fn(x, acc, acc)
    return acc


class AllReduce(Collective):
    name, method, reducing = "allreduce", "all_reduce", True

    def busbw_factor(self, p):
        return 2 * (p - 1) / p

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return vf.reduced(np.arange(count), p, dtype, redop)

    def reference(self, inputs, redop=None, root=0):
        total = _reduce_all(inputs, redop)
        return [total.copy() for _ in inputs]


    def stage_bytes(self, p, length, itemsize, root):
        # traced: its own 1/p block copied in at the start, and 1/p between the reduce-scatter and
        # the allgather phases (0.39 + 0.41 ms of a 29.65 ms 2 GiB op on 8 NPUs)
        own = np.full(p, -(-length // p) * itemsize, dtype=np.int64)
        return own, own.copy()

class Broadcast(Collective):
    name, method, rooted = "broadcast", "broadcast", True

    def stage_bytes(self, p, length, itemsize, root):
        # traced: the root copies the whole buffer in (3.17 ms of 2 GiB), every other rank copies
        # it out at the end (3.22 ms)
        ins, outs = np.zeros(p, dtype=np.int64), np.full(p, length * itemsize, dtype=np.int64)
        ins[root], outs[root] = length * itemsize, 0
        return ins, outs

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return vf.values(np.arange(count), root, dtype, redop)

    def reference(self, inputs, redop=None, root=0):
        return [np.array(inputs[root], copy=True) for _ in inputs]


class Reduce(Collective):
    name, method, reducing, rooted = "reduce", "reduce", True, True

    def result(self, out, rank, root):
        return out if rank == root else None

    def stage_bytes(self, p, length, itemsize, root):
        # traced: every rank copies the whole buffer in (3.19 ms of 2 GiB) and 1/p between the
        # reduce-scatter and the gather; the root also copies the whole result out (3.19 ms)
        ins = np.full(p, length * itemsize, dtype=np.int64)
        outs = np.full(p, -(-length // p) * itemsize, dtype=np.int64)
        outs[root] += length * itemsize
        return ins, outs

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return vf.reduced(np.arange(count), p, dtype, redop) if rank == root else None

    def reference(self, inputs, redop=None, root=0):
        total = _reduce_all(inputs, redop)
        return [total if r == root else None for r in range(len(inputs))]


class AllGather(Collective):
    name, method, block, min_ndim = "allgather", "all_gather", True, 1

    def output_shape(self, shape, p):
        return (p * shape[0],) + tuple(shape[1:])

    def op_bytes(self, count, p, itemsize):
        return count * itemsize * p          # nccl-tests: the whole gathered output

    def input_shape_for_bytes(self, nbytes, p, itemsize):
        return (self.count_for_bytes(nbytes, p, itemsize) // p,)

    def busbw_factor(self, p):
        return (p - 1) / p

    def layout(self, p):
        return (1, p, None)

    def stage_bytes(self, p, length, itemsize, root):
        # traced: the input (its own block) copied in; the copy of its own block into its output
        # runs during the link phase, which takes longer (0.41 ms of a 14.36 ms 2 GiB op)
        return np.full(p, length * itemsize, dtype=np.int64), np.zeros(p, dtype=np.int64)

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return np.concatenate([vf.values(np.arange(count), r, dtype, redop) for r in range(p)]) if p else None

    def reference(self, inputs, redop=None, root=0):
        total = np.concatenate(inputs, axis=0)
        return [total.copy() for _ in inputs]


class ReduceScatter(Collective):
    name, method, block, reducing = "reducescatter", "reduce_scatter", True, True
    min_ndim, divisible, has_scratch = 1, True, True

    def output_shape(self, shape, p):
        return (shape[0] // p,) + tuple(shape[1:])

    def busbw_factor(self, p):
        return (p - 1) / p

    def group_volume(self, nbytes, p):
        return nbytes // max(p, 1)             # its output's bytes

    def layout(self, p):
        return (p, 1, p)

    def stage_bytes(self, p, length, itemsize, root):
        # traced: one block (1/p of the input) copied in and its reduced block copied out
        # (0.40 + 0.40 ms of a 15.76 ms 2 GiB op on 8 NPUs)
        own = np.full(p, length * itemsize, dtype=np.int64)
        return own, own.copy()

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        m = count // p
        return vf.reduced(np.arange(rank * m, (rank + 1) * m), p, dtype, redop)

    def reference(self, inputs, redop=None, root=0):
        total = _reduce_all(inputs, redop)
        return list(np.split(total, len(inputs), axis=0))


class AllToAll(Collective):
    name, method, block = "alltoall", "all_to_all", True
    min_ndim, divisible, has_scratch = 1, True, True
    # p(p-1) blocks move one by one on real data (512 ranks: 3 s here; 1,024: 28 s);
    # hccl_sim.simulate prices larger ones without payload
    max_ranks_with_data = 512

    def busbw_factor(self, p):
        return (p - 1) / p

    def layout(self, p):
        return (p, p, p)

    def stage_bytes(self, p, length, itemsize, root):
        # traced: the whole send buffer copied in (3.21 ms of 2 GiB), and its own block into the
        # output (0.40 ms)
        return (np.full(p, p * length * itemsize, dtype=np.int64), np.full(p, length * itemsize, dtype=np.int64))

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        m = count // p              # block `rank` of every source rank, in source order
        return np.concatenate([vf.values(np.arange(rank * m, (rank + 1) * m), src, dtype, redop) for src in range(p)])

    def reference(self, inputs, redop=None, root=0):
        p = len(inputs)
        blocks = [np.split(x, p, axis=0) for x in inputs]
        return [np.concatenate([blocks[src][dst] for src in range(p)], axis=0) for dst in range(p)]


class Scatter(Collective):
    """HcclScatter: block j of the root's x (x.shape[0] divisible by the rank count) goes to rank j;
    every rank gives an x of that shape (the root's is read)."""
    name, method, block, rooted = "scatter", "scatter", True, True
    min_ndim, divisible, has_scratch = 1, True, True

    def output_shape(self, shape, p):
        return (shape[0] // p,) + tuple(shape[1:])

    def busbw_factor(self, p):
        return (p - 1) / p                     # nccl-tests' scatter_perf

    def group_volume(self, nbytes, p):
        return nbytes // max(p, 1)             # its output's bytes (calcOpDataVolume: recvCount)

    def layout(self, p):
        return (p, 1, p)

    def stage_bytes(self, p, length, itemsize, root):
        # coll_scatter_executor.cc RunLoopInner: the root copies the loop's p slices into the CCL
        # buffer; every rank copies its slice within it (ScatterMesh's resultMem) and out to its
        # output (no trace of a Scatter is published)
        block = length * itemsize
        ins, outs = np.zeros(p, dtype=np.int64), np.full(p, 2 * block, dtype=np.int64)
        ins[root] = p * block
        return ins, outs

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        m = count // p
        return vf.values(np.arange(rank * m, (rank + 1) * m), root, dtype, redop)

    def reference(self, inputs, redop=None, root=0):
        return [b.copy() for b in np.split(inputs[root], len(inputs), axis=0)]


class Barrier(Collective):
    """No data: every rank leaves once all have arrived."""
    name, method, carries_data = "barrier", "barrier", False

    def loops(self, count, p, itemsize, buffsize):
        return Loops(1, 1)          # one (empty) program

    def stage_bytes(self, p, length, itemsize, root):
        zero = np.zeros(p, dtype=np.int64)
        return zero, zero.copy()

    def verifiable(self, rank, p, count, dtype, redop="sum", root=0):
        return None

    def reference(self, inputs, redop=None, root=0):
        return [None for _ in inputs]


from .variable import AllToAllV, AllToAllVC  # noqa: E402 - they build on the classes above
from .gather_v import AllGatherV, ReduceScatterV  # noqa: E402

COLLECTIVES = {c.name: c for c in (AllReduce(), AllGather(), ReduceScatter(), Broadcast(), Reduce(), AllToAll(),
                                   Scatter(), AllToAllV(), AllToAllVC(), AllGatherV(), ReduceScatterV(), Barrier())}
"""name -> Collective, in nccl-tests' order, the variable-size ones after the six; `barrier` last
(it carries no data)."""
DATA_COLLECTIVES = tuple(n for n, c in COLLECTIVES.items() if c.carries_data and not c.variable)
"""The collectives of one count per rank (what most sweeps run)."""
VARIABLE = tuple(n for n, c in COLLECTIVES.items() if c.variable)
BLOCK = tuple(n for n, c in COLLECTIVES.items() if c.block)
VECTOR = tuple(n for n, c in COLLECTIVES.items() if c.carries_data and not c.block and not c.variable)
_ALIASES = {c.method: c.name for c in COLLECTIVES.values()}
_ALIASES.update({"bcast": "broadcast", "all-reduce": "allreduce", "all-gather": "allgather",
                 "reduce-scatter": "reducescatter", "all-to-all": "alltoall", "all_to_all": "alltoall",
                 "all-to-all-v": "alltoallv", "all-to-all-vc": "alltoallvc", "all-gather-v": "allgatherv",
                 "reduce-scatter-v": "reducescatterv"})


def get(name) -> Collective:
    """The collective called `name` (HCCL spelling, Communicator method name, or a common alias)."""
    key = name.lower() if isinstance(name, str) else None
    c = COLLECTIVES.get(_ALIASES.get(key, key)) if key is not None else None
    if c is None or not c.carries_data:
        raise HcclError("E_PARA", f"unknown collective {name!r}; expected one of "
                        f"{', '.join(DATA_COLLECTIVES + VARIABLE)}")
    return c


def of(name: str) -> Collective:
    """The collective of an internal (already canonical) name, barrier included."""
    return COLLECTIVES[name]


def check_op_bytes(nbytes: int, what: str = "op") -> None:
    if nbytes > MAX_OP_BYTES:
        raise HcclError("E_PARA", f"{what} of {nbytes} bytes per rank is larger than this emulator can price "
                        f"(at most 2^56 = {MAX_OP_BYTES} bytes: beyond that simulated nanoseconds overflow int64)")


def expected(op: str, rank: int, p: int, count: int, dtype: str, redop="sum", root: int = 0):
    """Rank `rank`'s expected output of `op` when every rank's input is hccl_sim.collectives.verifiable's
    pattern of `count` elements (each collective's class says what it is)."""
    return get(op).verifiable(rank, p, count, dtype, redop, root)
