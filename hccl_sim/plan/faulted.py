"""Where a fault plan meets the planner: a FaultPlan bound to the topology an op is priced on, and
the crash a bound plan puts in an op, found from the op's plan and its event-driven replay.

The plan itself is data (hccl_sim.faults.fault_plan); what needs pricing (the topology an op
runs on, when a step starts) is here, so the faults package never reaches up into the planner.
Every rank computes the same answers from the op's plan, so no rank waits for a dead one.
"""
from __future__ import annotations

import dataclasses

from topologies.errors import HcclError

from ..faults.fault_plan import BoundFaults, FaultPlan
from .costs import effective_cost
from .event_replay import step_clock, step_starts


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
    event-driven replay of the op); at: in the first op the rank has not left by that time (on
    entry if it was idle then)."""
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
            t = max(at_ns, plan.entry[rank])
        if found is None or (t, rank) < (found[1], found[0]):
            found = (rank, t, label, at_step)
    return found
