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

Both gathers stand for host-side negotiation (ncclCommSplit's bootstrap allgather; HCCL builds a
sub-communicator from what its ranks know), not HCCL ops: they set up no links, so an
hbm_pressure cannot starve them (`_exchange`). A member whose new CCL buffer does not fit in its
HBM (E_MEMORY: full, or an hbm_pressure holds the rest) says so in the init's gather instead of
its view: it raises its E_MEMORY, and every other member an E_TIMEOUT naming it, when its
HCCL_CONNECT_TIMEOUT + 20 s for the init runs out (docs/references.md §7.2, §8.3).
"""
from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from topologies.errors import Cause, HcclError
from topologies.model import seconds_to_ns
from topologies.subset import subset

from ..plan.costs import effective_cost
from ..plan.faulted import CONNECT_GRACE_S
from .record import OpRecord

NO_BUFFER = -1
"""What a member without its CCL buffer gathers instead of its view (-2 - k: the plan's hbm_pressure
k held the HBM it needed)."""


def _int(value, what, opname, rank, minimum=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            (minimum is not None and value < minimum):
        need = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise HcclError("E_PARA", f"{what} must be {need}, got {value!r}", rank=rank, op=opname,
                        cause=Cause.BAD_INPUT)
    return int(value)


def split(comm, color, key=0, env=None):
    """The communicator of the ranks that gave `color`, ordered by (key, rank); None for color None.
    `env`: HCCL_* settings of the new communicator (its HcclCommConfig) over the parent's."""
    if color is not None:
        color = _int(color, "color", "split", comm.rank, minimum=0)
    key = _int(key, "key", "split", comm.rank)
    config = comm.config.with_env(env)         # a bad variable fails here, before any peer waits on it
    seq, start = comm._seq, comm.clock
    mine = np.array([[-1 if color is None else color, key]], dtype=np.int64)
    everyone = _exchange(comm, mine)
    if color is None:
        return None
    members = sorted((int(k), r) for r, (c, k) in enumerate(everyone.tolist()) if c == color)
    return _derive(comm, tuple(r for _, r in members), f"{comm.scope}/split{seq}.{color}", "split", start, config)


def shrink(comm, exclude=None, env=None):
    """The communicator of the survivors: every rank but those in `exclude` and those lost (`env`:
    as for split)."""
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
    config = comm.config.with_env(env)
    gone |= comm.lost_ranks
    members = tuple(r for r in range(comm.size) if r not in gone)
    k = comm._shrinks
    comm._shrinks += 1
    return _derive(comm, members, f"{comm.scope}/shrink{k}", "shrink", comm.clock, config)


def _derive(parent, members: tuple, scope: str, opname: str, start: int, config):
    """This rank's communicator of the parent's ranks `members` (it is one of them), after its init;
    its last_op is the whole of it, from `start` (this rank's clock when the call began)."""
    base = effective_cost(parent.topology, parent.config).topology   # HCCL_INTER_HCCS_DISABLE's routes, if set
    topo = subset(base, members)
    world = tuple(parent.world_ranks[m] for m in members)
    if config.faults is not None:
        config = dataclasses.replace(config, faults=config.faults.restricted(world))
    group = parent._group.subgroup(parent.rank, members, scope, topo, config)
    comm = type(parent)(members.index(parent.rank), group, parent.device, keep_init_error=True)
    comm.scope, comm.world_ranks = scope, world
    comm.op_log = parent.op_log
    comm.runtime = parent.runtime
    # the init: every member's view of the members (or that it has no CCL buffer), gathered on the
    # new communicator
    view = zlib.crc32(np.asarray(world, dtype=np.int64).tobytes())
    said = view if comm._init_error is None else _no_buffer_word(config, comm._init_error)
    began = comm.clock
    views = _exchange(comm, np.array([[said, parent.world_ranks[parent.rank]]], dtype=np.int64))
    short = [(members[i], int(v)) for i, (v, _) in enumerate(views.tolist()) if v < 0]
    if short:
        _init_failed(comm, parent, short, began, opname)
    differ = [int(w) for v, w in views.tolist() if v != view]
    if differ:
        raise HcclError("E_PARA", f"{opname}: ranks disagree on the members of the new communicator (world ranks "
                        f"{differ[:8]} see other members than this rank's {list(world)[:16]})",
                        rank=comm.rank, op=opname, cause=Cause.MISMATCH, peers=differ)
    comm.last_op = OpRecord(opname, "init", 0, 0, "int64", start, comm.clock)
    return comm


def _exchange(comm, rows):
    """comm.all_gather(rows) as a bootstrap exchange: host negotiation, not an HCCL op (no link setup)."""
    comm._exchange = True
    try:
        return comm.all_gather(rows)
    finally:
        comm._exchange = False


def _no_buffer_word(config, error) -> int:
    """NO_BUFFER, or -2 - k when the plan's hbm_pressure k (the error's fault) held the HBM."""
    labels = [p[-1] for p in config.faults.pressures] if config.faults is not None else []
    return -2 - labels.index(error.fault) if error.fault in labels else NO_BUFFER


def _init_failed(comm, parent, short, began: int, opname: str):
    """The init of a new communicator some of whose members (`short`: (parent rank, word)) have no
    CCL buffer: theirs is their E_MEMORY; every other member waited for them from `began` until
    HCCL_CONNECT_TIMEOUT + 20 s ran out, freeing its own buffer (HCCL's failed init frees what it made)."""
    if comm._init_error is not None:
        raise comm._init_error.replace(rank=parent.rank, op=opname)
    comm.device.free(comm.ccl_buffer)
    faults = comm.config.faults
    label = next((faults.pressures[-2 - w][-1] for _, w in short if w != NO_BUFFER), None)
    limit = comm.config.connect_timeout_s + CONNECT_GRACE_S
    at = began + seconds_to_ns(limit)
    comm.device.clock = max(comm.device.clock, at)
    ranks = tuple(r for r, _ in short)
    raise HcclError("E_TIMEOUT", f"{opname}: rank {ranks[0]} could not allocate the new communicator's CCL buffer "
                    f"(out of HBM{f': {label}' if label else ''}); the communicator's init waited for it from "
                    f"{began / 1e9:.6f} s until HCCL_CONNECT_TIMEOUT + {CONNECT_GRACE_S} s ran out at {at / 1e9:.6f} s",
                    rank=parent.rank, op=opname, time_ns=at, cause=Cause.TIMEOUT, peers=ranks, fault=label,
                    detail={"comm_init": True, "connect_timeout_s": limit})
