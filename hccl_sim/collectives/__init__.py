"""The collective registry: what each collective *is*, in one class per collective.

Everything about a collective that is not an algorithm lives here, and every other part reads it
(the Communicator, the planner, the data planes of every engine, bench, verifiable inputs, the
tests): its names (HCCL/nccl-tests spelling and the Communicator method), the shape of its result,
how its buffers are laid out for a schedule (whole vectors, or rows of rank blocks), the CCL-buffer
loops of op-base mode, the scratch area a schedule may use, the bytes staged in and out of the CCL
buffer, nccl-tests' size and bus-bandwidth factor, a numpy reference result; and how a level's
program is built, which the algorithms build (`base.Collective.program`). Adding Gather or a V
variant is one class (in `fixed`, `variable` or `gather_v`) registered here, plus the algorithms
that build it (cf. msccl-tools' `Collective`, nccl-tests' `testColl`, SimGrid SMPI's colls table);
docs/design.md, "Adding a collective", lists the files.

Layouts: a *vector* collective (AllReduce, Broadcast, Reduce) schedules elements of one vector;
a *block* collective (AllGather, ReduceScatter, AlltoAll) schedules p rank blocks, and a loop takes
the same element range [a, b) of every block.
"""
from __future__ import annotations

from topologies.errors import HcclError

from .base import MAX_OP_BYTES, Collective, Loops  # noqa: F401 - the registry's public names
from .fixed import (MAX_ALLTOALL_RANKS, AllGather, AllReduce, AllToAll, Barrier, Broadcast,  # noqa: F401
                    Reduce, ReduceScatter, Scatter)
from .variable import AllToAllV, AllToAllVC
from .gather_v import AllGatherV, ReduceScatterV

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
