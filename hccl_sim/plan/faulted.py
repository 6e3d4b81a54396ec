"""Where a fault plan meets the planner: a FaultPlan bound to the topology an op is priced on, the
crash a bound plan puts in an op, found from the op's plan and its event-driven replay, an op
whose last rank comes later than HCCL_EXEC_TIMEOUT after its first (`late_entry_error`), and a
link setup an HBM pressure starves (`LinkSetupFailed`).

The plan itself is data (hccl_sim.faults.fault_plan); what needs pricing (the topology an op
runs on, when a step starts) is here, so the faults package never reaches up into the planner.
Every rank computes the same answers from the op's plan, so no rank waits for a dead one.
"""
from __future__ import annotations

import dataclasses

from topologies.errors import Cause, HcclError
from topologies.model import seconds_to_ns

from ..faults.fault_plan import BoundFaults, FaultPlan
from .costs import effective_cost
from .event_replay import step_clock, step_starts
from .loop_programs import op_overhead_ns

CONNECT_GRACE_S = 20
"""HCCL's link setup gives up HCCL_CONNECT_TIMEOUT + 20 s after it began (docs/references.md §7.2)."""


def with_faults(topo, config, faults):
    """`config` carrying `faults` (a FaultPlan or None) bound to the topology its ops are priced
    on (with HCCL_INTER_HCCS_DISABLE, RoCE between an A3 superpod's servers)."""
    if faults is None:
        return config
    if not isinstance(faults, FaultPlan):
        raise HcclError("E_PARA", f"faults must be a hccl_sim.FaultPlan (or None), got {type(faults).__name__}")
    return dataclasses.replace(config, faults=faults.bind(effective_cost(topo, config).topology, config))


def crash_in(faults: BoundFaults, plan, op_index: int, topo, config):
    """(rank, simulated ns, label) of the first crash `faults` has in this op, or None.

    at_op: on entering op number at_op (or, with at_step, when its step at_step starts, from the
    event-driven replay of the op); at: in the first op the rank has not left by that time, at that
    time (a time before the rank's entry is in its host code between ops: it dies there, and its
    peers' clocks for finding it lost count from then)."""
    found = _first_crash(faults, plan, op_index, topo, config)
    return None if found is None else found[:3]


def crash_steps(faults: BoundFaults, plan, op_index: int, topo, config) -> int:
    """How many of its steps of this op (counted over the op's loops) the rank crashing in it runs
    before it stops: at_step, or the steps it started before `at`; 0 when it dies on entering the
    op. What a real process moves before it dies (engine ray)."""
    rank, t, _, at_step = _first_crash(faults, plan, op_index, topo, config)
    if at_step is not None:
        return at_step
    if t <= plan.entry[rank]:
        return 0
    marks, _ = step_starts(plan, topo, config, rank)
    return sum(1 for m in marks if m < t)


def _first_crash(faults: BoundFaults, plan, op_index, topo, config):
    """(rank, ns, label, at_step) of the op's first crash (by time, then rank), or None."""
    found = None
    for rank, at_op, at_ns, at_step, label in faults.crashes:
        if at_op is not None:
            if at_op != op_index:
                continue
            t = plan.entry[rank] if at_step is None else step_clock(plan, topo, config, rank, at_step)
        else:
            if plan.exits[rank] <= at_ns:
                continue
            t = at_ns           # in the op, or before it: in the rank's host code since its last op
        if found is None or (t, rank) < (found[1], found[0]):
            found = (rank, t, label, at_step)
    return found


EI0002 = "EI0002 The wait execution of the Notify register times out, remote rank"
"""How HCCL's error report begins for a notify wait past HCCL_EXEC_TIMEOUT (docs/references.md
§9.2; the user-facing text issue reports quote, e.g. vllm-ascend#3413), the remote rank after it."""

NEVER_NS = 1 << 62
"""The entry clock a stalled rank's call carries: it never enters (no simulated time reaches it)."""


def late_entry_error(opname: str, config, entry: list):
    """The E_TIMEOUT of an op whose last rank enters more than HCCL_EXEC_TIMEOUT after its first
    (a slow peer: a straggler of the fault plan, or a long host step), or None. HCCL's ranks wait
    for their peers' notifies that long and then fail the op (docs/references.md §7.2; §10.2:
    EI0002, "a rank crashed or slow"); every rank is told, at its first rank's deadline (the later ranks find their peers gone), with the
    slow rank in `peers` and its straggler entry, if the plan has one, as the fault."""
    timeout = config.exec_timeout_s
    if not timeout or len(entry) < 2:
        return None
    first, last = min(entry), max(entry)
    limit = seconds_to_ns(timeout)
    if last - first <= limit:
        return None
    slow, early = entry.index(last), entry.index(first)
    if last >= NEVER_NS:                # a stalled rank: alive, never entering
        label = next((lb for r, _, _, lb in config.faults.stalls if r == slow), None)
        return HcclError("E_TIMEOUT", f"{EI0002} [{slow}]: rank {slow} never entered {opname} (stalled, {label}): its "
                         f"peers' notify wait passed HCCL_EXEC_TIMEOUT ({timeout} s)", op=opname, cause=Cause.TIMEOUT,
                         peers=(slow,), time_ns=first + limit, fault=label,
                         detail={"slow": slow, "stalled": True, "exec_timeout_s": timeout})
    label = config.faults.late_label(slow) if config.faults is not None else None
    why = f" ({label})" if label else ""
    return HcclError("E_TIMEOUT", f"{EI0002} [{slow}]: rank {slow} entered {opname} {(last - first) / 1e9:.6f} s "
                     f"after rank {early}: its peers' notify wait passed HCCL_EXEC_TIMEOUT ({timeout} s){why}", op=opname,
                     cause=Cause.TIMEOUT, peers=(slow,), time_ns=first + limit, fault=label,
                     detail={"slow": slow, "late_ns": last - first, "exec_timeout_s": timeout})


class LinkSetupFailed(HcclError):
    """A call whose link setup the fault plan's hbm_pressure starves on some ranks (`starved` in
    its detail: [(rank, label), ...]), as the planner finds it for every rank alike. It never
    reaches user code: each rank's communicator turns it into the rank's own error (`for_rank`).

    HCCL sets up a communicator's links on the first call of each op type and algorithm; a rank
    whose device cannot allocate the links' resources (a QP's memory) fails with EI0011, device out
    of memory (E_MEMORY), at once; its peers wait for its sockets until HCCL_CONNECT_TIMEOUT + 20 s
    and fail with EI0006 (E_TIMEOUT) (docs/references.md §7.2, §9.2, §10.2)."""

    def for_rank(self, rank: int, entry_ns: int) -> HcclError:
        """Rank `rank`'s error, entering the call at `entry_ns`: a starved rank returns after the
        call's host cost, the others when their connect timeout runs out."""
        d = self.detail
        starved = [(int(r), label) for r, label in d["starved"]]
        where = f"op {self.op}, algorithm {d['algo']}"
        mine = next((label for r, label in starved if r == rank), None)
        if mine is not None:
            at = entry_ns + d["call_ns"]
            return HcclError("E_MEMORY", f"Cluster Exception Location[rank {rank}], {where}, link setup at "
                             f"{at / 1e9:.6f} s: EI0011 device out of memory in link setup: another tenant of the "
                             f"NPU holds its free HBM ({mine})", rank=rank, op=self.op, time_ns=at,
                             cause=Cause.NO_MEMORY, fault=mine,
                             detail={"no_memory": True, "link_setup": True, "algo": d["algo"]})
        first, label = starved[0]
        limit = d["connect_timeout_s"]
        at = entry_ns + seconds_to_ns(limit)
        return HcclError("E_TIMEOUT", f"Cluster Exception Location[rank {first}], {where}, link setup from "
                         f"{entry_ns / 1e9:.6f} s to {at / 1e9:.6f} s: wait socket establish timeout (EI0006) after "
                         f"HCCL_CONNECT_TIMEOUT + {CONNECT_GRACE_S} s: rank {first} failed its link setup with "
                         f"EI0011 device out of memory ({label})", rank=rank, op=self.op, time_ns=at,
                         cause=Cause.TIMEOUT, peers=tuple(r for r, _ in starved), fault=label,
                         detail={"link_setup": True, "algo": d["algo"], "connect_timeout_s": limit})


def link_setup_failed(sig, algo: str, starved: tuple, cost, config) -> LinkSetupFailed:
    """The LinkSetupFailed of a call (`sig`, running `algo`) whose setup `starved` ranks fail."""
    return LinkSetupFailed("E_MEMORY", f"link setup of {sig.name} ({algo}) failed: ranks {[r for r, _ in starved]} "
                           "have no HBM free (hbm_pressure)", op=sig.name, cause=Cause.NO_MEMORY,
                           peers=tuple(r for r, _ in starved), fault=starved[0][1],
                           detail={"algo": algo, "starved": [list(s) for s in starved],
                                   "call_ns": op_overhead_ns(cost.device_model, sig.name),
                                   "connect_timeout_s": config.connect_timeout_s + CONNECT_GRACE_S})
