"""Communicators made from communicators: split (ncclCommSplit / HcclCreateSubCommConfig) and
shrink (ncclCommShrink, ULFM's MPIX_Comm_shrink), as Communicator.split and .shrink call them.

split(color, key): every rank of the parent calls it; ranks that gave the same color form a new
communicator, ordered by (key, parent rank); color None opts out (NCCL_SPLIT_NOCOLOR) and gets
None. As ncclCommSplit, the colors and keys are gathered from every rank first: here by an
AllGather on the parent, priced like any other op.

shrink(exclude): only the survivors call it, after a failure; the new communicator holds every
rank of the parent but those excluded and those this communicator lost (a crashed rank), renumbered
in rank order, as ncclCommShrink does (docs/references.md §8.3).

Either way the new communicator starts with its init: its members agree on who they are (an
AllGather of each member's view of the member list, priced on the new communicator: the cost of
the bootstrap exchange every NCCL/HCCL communicator init runs), so that ranks with different
views fail with an HcclError naming both instead of waiting on each other. Its ops are priced on
the members' real places in the cluster (topologies.subset), its fault plan is the job's: link
faults by the cluster's links, stragglers and `at`-second crashes by world rank; the op indices
of `at_op` crashes and of stragglers' `ops` count the collectives of the communicator the run
handed each rank (the world), and a `corrupt` entry's nth its transfers, so they do not apply to
communicators made from it. A new communicator starts on its dies' own NICs (a backup NIC the
parent switched to is the parent's links': its own L2 retry switches again).
"""
from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from topologies.errors import Cause, HcclError
from topologies.subset import subset

from ..plan.costs import effective_cost
from .record import OpRecord


def _int(value, what, opname, rank, minimum=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            (minimum is not None and value < minimum):
        need = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise HcclError("E_PARA", f"{what} must be {need}, got {value!r}", rank=rank, op=opname,
                        cause=Cause.BAD_INPUT)
    return int(value)


def split(comm, color, key=0):
    """The communicator of the ranks that gave `color`, ordered by (key, rank); None for color None."""
    if color is not None:
        color = _int(color, "color", "split", comm.rank, minimum=0)
    key = _int(key, "key", "split", comm.rank)
    seq, start = comm._seq, comm.clock
    mine = np.array([[-1 if color is None else color, key]], dtype=np.int64)
    everyone = comm.all_gather(mine)
    if color is None:
        return None
    members = sorted((int(k), r) for r, (c, k) in enumerate(everyone.tolist()) if c == color)
    return _derive(comm, tuple(r for _, r in members), f"{comm.scope}/split{seq}.{color}", "split", start)


def shrink(comm, exclude=None):
    """The communicator of the survivors: every rank but those in `exclude` and those lost."""
    if exclude is None:
        exclude = ()
    if not isinstance(exclude, (list, tuple, set, frozenset, range)):
        raise HcclError("E_PARA", f"exclude must be a list of ranks, got {type(exclude).__name__}",
                        rank=comm.rank, op="shrink", cause=Cause.BAD_INPUT)
    gone = {_int(r, "exclude entry", "shrink", comm.rank, minimum=0) for r in exclude}
    bad = sorted(r for r in gone if r >= comm.size)
    if bad:
        raise HcclError("E_PARA", f"exclude names rank {bad[0]}, not a rank of this communicator (0..{comm.size - 1})",
                        rank=comm.rank, op="shrink", cause=Cause.BAD_INPUT)
    if comm.rank in gone:
        raise HcclError("E_PARA", f"rank {comm.rank} is in exclude: only the survivors call shrink",
                        rank=comm.rank, op="shrink", cause=Cause.BAD_INPUT)
    gone |= comm.lost_ranks
    members = tuple(r for r in range(comm.size) if r not in gone)
    k = comm._shrinks
    comm._shrinks += 1
    return _derive(comm, members, f"{comm.scope}/shrink{k}", "shrink", comm.clock)


def _derive(parent, members: tuple, scope: str, opname: str, start: int):
    """This rank's communicator of the parent's ranks `members` (it is one of them), after its init;
    its last_op is the whole of it, from `start` (this rank's clock when the call began)."""
    base = effective_cost(parent.topology, parent.config).topology   # HCCL_INTER_HCCS_DISABLE's routes, if set
    topo = subset(base, members)
    world = tuple(parent.world_ranks[m] for m in members)
    config = parent.config
    if config.faults is not None:
        config = dataclasses.replace(config, faults=config.faults.restricted(world))
    group = parent._group.subgroup(parent.rank, members, scope, topo, config)
    comm = type(parent)(members.index(parent.rank), group, parent.device)
    comm.scope, comm.world_ranks = scope, world
    comm.op_log = parent.op_log
    comm.runtime = parent.runtime
    # the init: every member's view of the members, gathered on the new communicator
    view = zlib.crc32(np.asarray(world, dtype=np.int64).tobytes())
    views = comm.all_gather(np.array([[view, parent.world_ranks[parent.rank]]], dtype=np.int64))
    differ = [int(w) for v, w in views.tolist() if v != view]
    if differ:
        raise HcclError("E_PARA", f"{opname}: ranks disagree on the members of the new communicator (world ranks "
                        f"{differ[:8]} see other members than this rank's {list(world)[:16]})",
                        rank=comm.rank, op=opname, cause=Cause.MISMATCH, peers=differ)
    comm.last_op = OpRecord(opname, "init", 0, 0, "int64", start, comm.clock)
    return comm
