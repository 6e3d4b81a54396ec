"""The event-driven replay of a plan, loop by loop with the op's fixed costs: exit clocks under
link faults and corrupted transfers, every rank's step start clocks (where a fault plan's crash
falls mid-op), and the Chrome-trace events of an op (every try of an op retry included).
"""
from __future__ import annotations

import threading

from hcomm.link_state import LinkFailure
from hcomm.steps import Send
from topologies.errors import HcclError

from .costs import effective_cost, priced_as
from .loop_programs import op_overhead_ns, program_rank_steps

LOOPS_REPLAYED = 4096
"""Most buffer loops an op may have to be replayed loop by loop (traced, under link faults or
crashing mid-op); the closed-form pricing of loops gives up after as many too."""


def sends(program, p: int, src: int, dst: int) -> int:
    """Transfers src -> dst in one loop's program (the replay numbers them in this order)."""
    if not program:
        return 0
    return sum(1 for step in program_rank_steps(program, p)[src] for op in step
               if isinstance(op, Send) and op.peer == dst)


def replayed_exits(sig, loops, programs, entry, cost, marks=None, events=None, corrupt=None) -> list:
    """Exit clocks from the event-driven replay under the cost model's link state, loop by loop
    with the same fixed costs as _time_loops (`marks`: every rank's step start clocks; `events`:
    the trace, appended; `corrupt`: {(src, dst, k): label} of the op's corrupted transfers, k
    counted over its loops, consumed as they are transmitted)."""
    from hcomm.timing import replay
    if len(loops) > LOOPS_REPLAYED:
        raise HcclError("E_NOT_SUPPORT", f"an op of {len(loops)} buffer loops is not replayed loop by loop (traced, "
                        f"under link faults or crashing mid-op; at most {LOOPS_REPLAYED}); use a larger "
                        "HCCL_BUFFSIZE")
    p = cost.num_ranks
    dm = cost.device_model
    clock = [int(t) + op_overhead_ns(dm, sig.name) for t in entry]
    spans = list(loops)             # a barrier's one loop is (0, 1) (collectives.Barrier.loops)
    before = dict.fromkeys({(a, b) for a, b, _ in corrupt}, 0) if corrupt else None   # the pairs' earlier transfers
    for k, (a, b) in enumerate(spans):
        if k:
            clock = [t + dm.loop_overhead_ns for t in clock]
        program = programs[loops.key(a, b)]
        clock = replay(program_rank_steps(program, p), clock, cost, dtype=sig.dtype,
                       redop=sig.redop or "sum", op_name=sig.name, links=cost.link_state, marks=marks,
                       events=events, corrupt=corrupt, first=before)
        if before:
            before = {pair: n + sends(program, p, *pair) for pair, n in before.items()}
    return [int(t) for t in clock]


def trace_events(sig, loops, programs, topo, config, history, corrupt, choice) -> list:
    """Chrome-trace events of the op from the event-driven replay, loop by loop with the op's fixed
    costs: every try of `history` (one, without faults): a failed try up to its error CQE, the wait
    before the next try (an event on every rank), then the try that succeeded; each try on the
    routes it ran on (a backup NIC switched to before it), losing the corrupted attempts it met."""
    events = []
    remaining = dict(corrupt or {})
    for k, (at, failure, backup) in enumerate(history):
        cost = priced_as(effective_cost(topo, config, backup), choice)
        try:
            replayed_exits(sig, loops, programs, at, cost, events=events, corrupt=remaining)
        except LinkFailure:
            pass                               # its events up to the error CQE are in
        if failure is None:
            break
        resume = history[k + 1][0]
        for r in range(cost.num_ranks):
            events.append((r, f"op retry {k + 1}: wait", failure.time_ns, resume[r],
                           {"cause": failure.label, "link": f"rank {failure.src} -> rank {failure.dst}"}))
    return events


def step_starts(plan, topo, config, rank: int) -> tuple:
    """(`rank`'s clock as it starts each of its steps of the op, counted over the op's loops; its
    exit clock) in the try that completed the op (the one whose data moves: hccl_sim.faults.retry)."""
    marks, exits, _ = _step_marks(plan, topo, config)[-1]
    return marks[rank], exits[rank]


def step_clock(plan, topo, config, rank: int, step: int) -> int:
    """`rank`'s clock as it starts its step number `step` of the op (counted over the op's loops;
    past its last step: its exit), from the event-driven replay of the plan.

    An op retried after a link failure is replayed try by try (each on the routes it ran on, losing
    the corrupted attempts it met, as the trace does): a failed try's replay stops at its error CQE
    (every rank stops there), so a step the rank had not started in it by then is found in a later
    try; the last try completes (the plan priced it)."""
    for marks, exits, failed_at in _step_marks(plan, topo, config):
        mine = marks[rank]
        if exits is None:
            if step < len(mine) and mine[step] <= failed_at:
                return mine[step]
            continue
        return mine[step] if step < len(mine) else exits[rank]
    raise HcclError("E_INTERNAL", f"rank {rank}: every try of {plan.signature.describe()} failed in its replay, "
                    "yet the op was planned as completed")


_STEP_MARKS_LOCK = threading.Lock()


def _step_marks(plan, topo, config) -> list:
    """Every try's (step start clocks of every rank, exits or None, error CQE time or None), from
    the replay; kept on the plan, which every rank of an in-process engine shares, so that the op
    is replayed once and not once per rank."""
    if plan.unshifted is not plan:          # a ShiftedPlan: its plan's marks, shifted (timing is shift-invariant)
        b = plan.base
        return [([[t + b for t in mine] for mine in marks], None if exits is None else [t + b for t in exits],
                 None if failed is None else failed + b)
                for marks, exits, failed in _step_marks(plan.unshifted, topo, config)]
    memo = plan.__dict__
    with _STEP_MARKS_LOCK:
        if "_step_marks" in memo:
            return memo["_step_marks"]
        tries = []
        remaining = dict(plan.corrupt or {})
        for at, backup in plan.tries or [(plan.entry, plan.backup)]:
            cost = effective_cost(topo, config, backup)
            marks = [[] for _ in range(cost.num_ranks)]
            try:
                exits = replayed_exits(plan.signature, plan.loops, plan.programs, at, cost, marks, corrupt=remaining)
            except LinkFailure as failure:
                tries.append((marks, None, failure.time_ns))
                continue
            tries.append((marks, exits, None))
            break
        memo["_step_marks"] = tries
        return tries
