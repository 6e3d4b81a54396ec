"""The base of every collective (hccl_sim.collectives): the facts a collective declares and the hooks
the rest of the library asks, so nothing outside this package tests an op by name.

Facts: its names, whether it takes a reduce op or a root, carries data, schedules rank blocks,
moves a count per pair (variable size), whose selection it follows, whether every rank leaves
together. Hooks: the root check that hccl_sim.simulate and the Communicator share; how one loop's
program is built on the levels selection chose (flat, HCCL's hierarchy on servers, its pipeline,
an A3 SuperPoD), which the algorithms build; sizes, loops, layouts and CCL-buffer staging.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from topologies.errors import HcclError
from topologies.validate import integer

from .. import algorithms
from ..algorithms.common import local_copy

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

    def with_cap(self, cap: int) -> "Loops":
        """The same elements `cap` at a time (an algorithm that cuts its loops its own way)."""
        return Loops(self.per, cap)

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

    # ---- how the planner keys, builds and prices the loops' programs --------------------------
    closed_form = True
    """Every full loop runs one program: full loops are priced in closed form once they repeat."""

    def key(self, a: int, b: int):
        """The key of loop [a, b)'s program: its length (equal loops run one program)."""
        return b - a

    def uses(self) -> list:
        """(program key, how many loops run it), in loop order."""
        return [(n, k) for n, k in ((self.cap, self.full), (self.tail, 1)) if n and k]

    def build(self, key, builder):
        """The program `key` names, by `builder` (hccl_sim.plan.loop_programs.LoopBuilder): here a
        loop of `key` elements."""
        return builder.fixed(key)

    def no_programs(self) -> dict:
        """The programs of an op of no loops."""
        return {}


class Collective:
    """Base of every collective. Subclasses set the class attributes and override what differs."""
    name: str = ""              # HCCL / nccl-tests name: "allreduce"
    method: str = ""            # the Communicator method: "all_reduce"
    block: bool = False         # schedules rank blocks (True) or one vector (False)
    input_is_block: bool = False    # a block collective whose input is one rank block, not p (AllGather)
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
    releases_together: bool = False     # every rank leaves when the last has arrived (Barrier)
    double_ring: bool = True        # on A3's double ring a loop runs as two halves side by side
    rank_rows: Optional[int] = None  # the buffer whose rows are the ranks' blocks (a block op's superpod levels)
    max_ranks_priced = None         # most ranks hccl_sim.simulate prices it on (None: no limit of its own)
    max_ranks_priced_why = ""       # the constant behind that limit and why, as the error says it
    # a small input may travel with its call (MPI's eager protocol): every rank's input has one shape,
    # so each rank can compute its own result from the calls (not the variable-size ops)
    eager: bool = True
    inline_only: bool = False       # HCCL runs it only where the DMA engine reduces inline (ReduceScatterV)

    def __repr__(self):
        return f"<collective {self.name}>"

    # ---- calls -------------------------------------------------------------------------------
    def checked_root(self, root, p: int, where: str = "") -> Optional[int]:
        """The call's root as an int, None for a collective without one; E_PARA naming the root when
        it is not a rank in [0, p). The one check hccl_sim.simulate and the Communicator both make."""
        return integer(root, "root", 0, p - 1, where=where) if self.rooted else None

    def priced_ranks_problem(self, p: int) -> Optional[str]:
        """None if hccl_sim.simulate (or bench on the timing engine) prices it on p ranks, else why not."""
        if self.max_ranks_priced is None or p <= self.max_ranks_priced:
            return None
        return f"{p} ranks are over the limit of {self.max_ranks_priced} {self.max_ranks_priced_why}"

    def priced_choice_problem(self, p: int, choice) -> Optional[str]:
        """None if hccl_sim.simulate prices it on p ranks with what selection chose (a
        selection.Choice), else why not: the limit of an op whose algorithms price differently."""
        return None

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

    def buffer_bytes(self, sig, p: int, itemsize: int) -> int:
        """Bytes of each rank's buffer, which the emulator can price up to MAX_OP_BYTES."""
        return (sig.count if self.carries_data else 0) * itemsize

    def data_loops(self, sig, p: int, loops, loop_programs) -> tuple:
        """(((start, stop, program), ...), scratch shape) of the op's DataProgram (plan.lowering), from
        the plan's loops and its ((start, stop), program) pairs: each loop views [start, stop)."""
        return tuple((a, b, program) for (a, b), program in loop_programs), self.scratch_shape_of(sig, p, loops)

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

    # ---- what the rendezvous and the planner ask of a call ---------------------------------------
    def merged_signatures(self, signatures: list) -> list:
        """Every rank's signature as the op is planned (the rendezvous asks): as they are, for a
        collective whose calls carry nothing of their own (a variable-size op merges its rows)."""
        return signatures

    def describe_counts(self, sig) -> list:
        """What a call's description adds about its counts (none here)."""
        return []

    # ---- a call for a given size, as bench, chaos and tests make one ----------------------------
    def call_counts(self, counts, rank: int) -> tuple:
        """The Communicator method's count arguments on `rank` (none: a fixed-size collective)."""
        return ()

    def input_of(self, x, counts, rank: int):
        """`rank`'s input, cut from `x` for a call of `counts` (all of it here)."""
        return x

    def output_shape_of(self, x, p: int, counts, rank: int) -> tuple:
        """The shape of `rank`'s result for input `x` and `counts`."""
        return self.output_shape(x.shape, p)

    def references(self, inputs: list, counts, redop=None, root: int = 0) -> list:
        """Every rank's expected result of a call on `inputs` (and `counts`), by numpy."""
        return self.reference(inputs, redop, root)

    def size_args(self, split, p: int, elements: int, itemsize: int) -> dict:
        """hccl_sim.simulate's size arguments for a call of `elements` elements per rank."""
        return {"nbytes": elements * itemsize}

    def counts_for(self, split, p: int, elements: int):
        """The counts a call of `elements` elements takes when `split` (hccl_sim.collectives.splits.Counts)
        says how it divides among ranks: None, a call of this collective takes none."""
        return None

    def simulated_size(self, nbytes, counts, p: int, itemsize: int) -> tuple:
        """(input shape, variable-size counts or None) of hccl_sim.simulate(op, nbytes, counts=...):
        a size in bytes here; E_PARA naming what is wrong."""
        if counts is not None:
            raise HcclError("E_PARA", f"simulate {self.name}: counts= is for the variable-size ops (alltoallv, "
                            "alltoallvc, allgatherv, reducescatterv); give nbytes")
        nbytes = integer(nbytes, "nbytes", 0, where="simulate")
        problem = self.priced_ranks_problem(p)
        if problem:
            raise HcclError("E_PARA", f"simulate {self.name}: {problem}")
        return self.input_shape_for_bytes(nbytes, p, itemsize), None

    # ---- how one loop's program is built (hccl_sim.plan.loop_programs asks; the algorithms build) --
    def program(self, choice, view, length: int, unit: int, root: int) -> list:
        """The unstaged program of one loop of `length` elements (per block for block collectives) of
        `unit` bytes each (program_unit) on the levels `choice` (a selection.Choice) names. `view`
        (plan.loop_programs.Levels) gives the cost model's rank count, servers (algorithms.hierarchy),
        superpods (algorithms.superpod, None off an A3 SuperPoD) and SDMA groups."""
        if choice.flat:
            if choice.level1 == "grouped_fullmesh":
                return self.grouped_program(view.sdma_groups, unit)
            return algorithms.flat_program(self.name, choice.level1, view.p, length, unit, root)
        if view.p == 1:         # one rank: HCCL copies the input to the output, whatever the levels
            return local_copy(1, length, unit)
        if view.pods is not None:
            return self.superpod_program(view.pods, choice, length, unit, root, 0)
        l0, l1 = choice.level0 or "fullmesh", choice.level1 or "ring"
        if l1 == "pipeline":
            return self.pipeline_program(view.servers, length, unit)
        return self.server_program(view.servers, length, unit, root, l0, l1)

    def server_program(self, srv, length: int, unit: int, root: int, l0: str, l1: str) -> list:
        """HCCL's hierarchy on servers: level0 `l0` inside each, level1 `l1` across (algorithms.hierarchy)."""
        raise self._no("on servers")

    def pipeline_program(self, srv, length: int, unit: int) -> list:
        """HCCL's pipeline over both levels (algorithms.pipeline)."""
        raise self._no("as a pipeline")

    def superpod_program(self, pods, choice, length: int, unit: int, root: int, ring_index: int) -> list:
        """A3's levels (algorithms.superpod); `ring_index`: which half of the double ring."""
        raise self._no("on a SuperPoD")

    def grouped_program(self, group_of, unit: int) -> list:
        """The grouped full mesh over SDMA groups (`group_of`: each rank's group; A3's AlltoAll)."""
        raise self._no("on the grouped full mesh")

    def _no(self, where: str) -> HcclError:
        return HcclError("E_NOT_SUPPORT", f"{self.name} has no program {where} in hccl-sim")

    @staticmethod
    def superpod_levels(choice) -> tuple:
        """(level1, level2) of an A3 program: ring and NHR unless selection chose otherwise."""
        return choice.level1 or "ring", choice.level2 or "NHR"

    # ---- layout of a schedule's buffers ----------------------------------------------------------
    def loops(self, count: int, p: int, itemsize: int, buffsize: int) -> Loops:
        """op-base mode: data larger than the CCL buffer is processed in buffer-sized loops."""
        if self.block:
            per = count if self.input_is_block else count // p
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
