"""From a collective call to its plan: it only composes. What the collective is comes from
hccl_sim.collectives, which algorithm runs from hccl_sim.selection, the program of a loop from
hccl_sim.programs (over hccl_sim.algorithms), and what it costs from the CostModel (hcomm.cost),
which owns every cache.

Engine-agnostic and deterministic: every engine (and every rank of a distributed engine) that
plans the same signature with the same entry clocks gets the same plan, which is why simulated
times are identical across engines.

Levels. Hardware topologies run HCCL's hierarchy: level0 inside a server chosen from the
hardware, level1 among the same-index cards of all servers (on an A3 SuperPoD, of a superpod's
servers, and level2 among superpods). Synthetic topologies are one flat level.

Loops: as HCCL in op-base mode, data larger than the CCL buffer (HCCL_BUFFSIZE) is processed in
buffer-sized loops; on hardware presets each loop is staged user -> CCL buffer -> user. Loops are
priced in closed form: timing is invariant under a uniform shift, so once full loops move every
rank's clock by the same amount, every further such run of loops does exactly that too.
"""
from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from hcomm.cost import CostModel, as_cost
from hcomm.faults import LinkFailure
from hcomm.vtiming import program_times
from topologies.errors import HcclError
from topologies.presets import without_inter_hccs

from . import collectives as colls
from .retry import priced_with_retry
from .programs import loop_parts, pods_of, program_rank_steps, servers_of
from .selection import Choice, Context, select

_LOOPS_BEFORE_GIVING_UP = 4096    # full loops priced one by one before a shift pattern must show


class Signature(NamedTuple):
    """What every rank must agree on for a collective call."""
    name: str                 # "allreduce", ...
    shape: tuple
    dtype: str
    redop: Optional[str]
    root: Optional[int]
    algo: Optional[str]       # the algo= argument as given
    inplace: bool = False     # out= aliases the input (HCCL's sendBuf == recvBuf): no op retry

    def describe(self) -> str:
        parts = [f"shape={self.shape}", f"dtype={self.dtype}"]
        if self.redop is not None:
            parts.append(f"op={self.redop}")
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.algo is not None:
            parts.append(f"algo={self.algo!r}")
        if self.inplace:
            parts.append("out=input")
        return f"{colls.of(self.name).method}({', '.join(parts)})"

    @property
    def count(self) -> int:
        return math.prod(self.shape)


@dataclass
class OpPlan:
    """What every rank of one collective call executes, and when each rank leaves it."""
    signature: Signature
    choice: Choice
    loops: colls.Loops        # element ranges processed per loop (per block for block collectives)
    programs: dict            # loop length -> the program (list of global steps) of such a loop
    entry: list               # entry clock of every rank (ns)
    exits: list               # exit clock of every rank (ns)
    nbytes: int               # bytes of the op as nccl-tests sizes it
    events: Optional[list] = None
    parts: Optional[dict] = None   # loop length -> ((start, stop, program), ...) run one after another on
                                   # data where the timing program runs them side by side (A3's double ring)
    retries: int = 0               # op retries a link failure cost (hccl_sim.retry)
    tries: Optional[list] = None   # every try's entry clocks, first to last (under link faults)

    @functools.cached_property
    def algo(self) -> str:
        """What ran, e.g. "ring" or "level0:fullmesh;level1:NHR" (with HCCL's fallback, if any)."""
        return self.choice.label

    @property
    def collective(self) -> colls.Collective:
        return colls.of(self.signature.name)

    def loop_programs(self):
        """((start, stop), program) of every loop, in order: what the data engines execute. A loop
        the double ring halves is its two halves' programs (columns apart, so in any order)."""
        parts = self.parts
        for a, b in self.loops:
            split = parts.get(b - a) if parts else None
            if split is None:
                yield (a, b), self.programs[b - a]
            else:
                for lo, hi, program in split:
                    yield (a + lo, a + hi), program


def op_loops(sig: Signature, p: int, itemsize: int, config) -> colls.Loops:
    coll = colls.of(sig.name)
    count = sig.count if coll.carries_data else 0
    colls.check_op_bytes(count * itemsize)
    return coll.loops(count, p, itemsize, config.buffsize_bytes)


def _time_loops(loops, programs, rel, cost, dtype, redop) -> np.ndarray:
    """Exit clocks after every loop, full loops priced in closed form once they repeat.

    Every loop after the first starts with the preset's per-loop fixed cost (HCCL re-launches the
    schedule for each CCL-buffer slice); the first one's is the op's own, charged at entry.
    Timing is a max-plus map, invariant under a *uniform* shift: f(e + c) = f(e) + c for a scalar
    c. So once q consecutive full loops have moved every rank's clock by the same amount c
    (e_k = e_{k-q} + c, the periodic regime; q <= _PERIOD_MAX), every further q loops do exactly
    that too: whole periods are one addition, and the few loops left over are priced one by one.
    The search starts after the first loop, so that every loop it compares pays the same fixed cost."""
    clock = np.asarray(rel, dtype=np.int64)
    again = cost.device_model.loop_overhead_ns
    full = programs.get(loops.cap)
    done = 0
    if loops.full:
        clock = program_times(full, clock, cost, dtype, redop)
        done = 1
    history = [clock]
    while done < loops.full:
        clock = program_times(full, clock + again, cost, dtype, redop)
        done += 1
        history.append(clock)
        period = _uniform_period(history)
        if period:
            q, c = period
            periods = (loops.full - done) // q
            if periods:
                _check_overflow(clock, c, periods)
                clock = clock + c * periods
                done += periods * q
            for _ in range(loops.full - done):
                clock = program_times(full, clock + again, cost, dtype, redop)
            done = loops.full
            break
        if done >= _LOOPS_BEFORE_GIVING_UP:
            raise HcclError("E_INTERNAL", f"{loops.full} buffer loops reached no periodic time pattern after "
                            f"{done}; cannot price them in closed form")
        del history[:-(_PERIOD_MAX + 1)]
    if loops.tail:
        clock = program_times(programs[loops.tail], clock + (again if loops.full else 0), cost, dtype, redop)
    return clock


_PERIOD_MAX = 8


def _uniform_period(history):
    """(q, c) when the last clocks moved uniformly by c over the last q loops, else None."""
    last = history[-1]
    for q in range(1, min(_PERIOD_MAX, len(history) - 1) + 1):
        delta = last - history[-1 - q]
        if delta.size and delta.min() == delta.max():
            return q, int(delta[0])
    return None


def _check_overflow(clock, step: int, remaining: int):
    if int(clock.max()) + step * remaining > np.iinfo(np.int64).max // 2:
        raise HcclError("E_PARA", f"the op's simulated time overflows int64 nanoseconds ({remaining} more buffer "
                        "loops); use a smaller size or a larger HCCL_BUFFSIZE")


def plan_times(sig, cost, config, itemsize, choice, entry, faults: bool = True):
    """(loops, programs by loop length, exit clocks, data parts) of the op from `entry` clocks.

    Fault-free prices are cached by relative entry clocks (timing is shift-invariant). Under a
    link state (a fault plan) an op whose fault-free span meets a change is re-priced by the
    event-driven replay from its absolute clocks, which retransmits over down links and may raise
    hcomm.faults.LinkFailure; an op no change meets is exactly its fault-free self."""
    p = cost.num_ranks
    loops = op_loops(sig, p, itemsize, config)
    lengths = [n for n in {loops.cap if loops.full else None, loops.tail or None} if n]
    if sig.name == "barrier":
        lengths = [1]
    built = {n: loop_parts(cost, sig.name, choice, n if sig.name != "barrier" else 0, itemsize, sig.root)
             for n in lengths}
    programs = {n: got[0] for n, got in built.items()}
    parts = {n: got[1] for n, got in built.items() if got[1] is not None}
    cache = cost.cache("timings")
    base = min(entry) if len(entry) else 0
    rel = tuple(int(t) - base for t in entry)
    key = (sig.name, sig.shape, sig.dtype, sig.redop, sig.root, choice.structure, config.buffsize_bytes, itemsize, rel)
    rel_exits = cache.get(key)
    if rel_exits is None:
        # the op's fixed host-side cost (expansion and launch) delays every rank before its first step
        start = np.asarray(rel, dtype=np.int64) + cost.device_model.op_overhead_ns.get(sig.name, 0)
        clock = _time_loops(loops, programs, start, cost, sig.dtype, sig.redop or "sum")
        rel_exits = cache[key] = tuple(int(t) for t in clock)
    exits = [base + t for t in rel_exits]
    links = cost.link_state
    if faults and links and links.affects(base, max(exits, default=base)):
        exits = _replayed_exits(sig, loops, programs, entry, cost)
    return loops, programs, exits, parts or None


def _replayed_exits(sig, loops, programs, entry, cost, marks=None, events=None) -> list:
    """Exit clocks from the event-driven replay under the cost model's link state, loop by loop
    with the same fixed costs as _time_loops (`marks`: every rank's step start clocks; `events`:
    the trace, appended)."""
    from hcomm.timing import replay
    if len(loops) > _LOOPS_BEFORE_GIVING_UP:
        raise HcclError("E_NOT_SUPPORT", f"an op of {len(loops)} buffer loops is not replayed loop by loop (traced, "
                        f"under link faults or crashing mid-op; at most {_LOOPS_BEFORE_GIVING_UP}); use a larger "
                        "HCCL_BUFFSIZE")
    p = cost.num_ranks
    dm = cost.device_model
    clock = [int(t) + dm.op_overhead_ns.get(sig.name, 0) for t in entry]
    spans = [(0, 1)] if sig.name == "barrier" else list(loops)
    for k, (a, b) in enumerate(spans):
        if k:
            clock = [t + dm.loop_overhead_ns for t in clock]
        clock = replay(program_rank_steps(programs[b - a], p), clock, cost, dtype=sig.dtype,
                       redop=sig.redop or "sum", op_name=sig.name, links=cost.link_state, marks=marks,
                       events=events)
    return [int(t) for t in clock]


def _trace_events(sig, loops, programs, cost, history) -> list:
    """Chrome-trace events of the op from the event-driven replay, loop by loop with the op's fixed
    costs: every try of `history` (one, without faults): a failed try up to its error CQE, the wait
    before the next try (an event on every rank), then the try that succeeded."""
    events = []
    for k, (at, failure) in enumerate(history):
        try:
            _replayed_exits(sig, loops, programs, at, cost, events=events)
        except LinkFailure:
            pass                               # its events up to the error CQE are in
        if failure is None:
            break
        resume = history[k + 1][0]
        for r in range(cost.num_ranks):
            events.append((r, f"op retry {k + 1}: wait", failure.time_ns, resume[r],
                           {"cause": failure.label, "link": f"rank {failure.src} -> rank {failure.dst}"}))
    return events


def step_clock(plan, topo, config, rank: int, step: int) -> int:
    """`rank`'s clock as it starts its step number `step` of the op (counted over the op's loops;
    past its last step: its exit), from the event-driven replay of the plan.

    An op retried after a link failure is replayed try by try: a failed try's replay stops at its
    error CQE (every rank stops there), so a step the rank had not started in it by then is found
    in a later try; the last try completes (the plan priced it)."""
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
    memo = getattr(plan, "__dict__", None)            # a ShiftedPlan has no room for it: replayed each time
    with _STEP_MARKS_LOCK:
        if memo is not None and "_step_marks" in memo:
            return memo["_step_marks"]
        cost = effective_cost(topo, config)
        tries = []
        for at in getattr(plan, "tries", None) or [plan.entry]:
            marks = [[] for _ in range(cost.num_ranks)]
            try:
                exits = _replayed_exits(plan.signature, plan.loops, plan.programs, at, cost, marks)
            except LinkFailure as failure:
                tries.append((marks, None, failure.time_ns))
                continue
            tries.append((marks, exits, None))
            break
        if memo is not None:
            memo["_step_marks"] = tries
        return tries


def effective_cost(topo, config):
    """The CostModel a communicator with `config` prices on: on an A3 SuperPoD with
    HCCL_INTER_HCCS_DISABLE=TRUE, that of the topology with RoCE between its servers."""
    cost = as_cost(topo)
    params = cost.topology.params
    if config.inter_hccs_disable and params.get("superpod_of_server") is not None and params.get("inter_hccs", True):
        cost = as_cost(without_inter_hccs(cost.topology))
    faults = config.faults
    if faults is not None and faults.link_state and cost.link_state != faults.link_state:
        cost = CostModel.of(cost.topology, faults.link_state)
    return cost


def choose(sig: Signature, topo, config, itemsize: int) -> Choice:
    """What runs for this call on `topo` (a Topology or its CostModel): selection.select's answer."""
    cost = effective_cost(topo, config)
    p = cost.num_ranks

    def price(choice):
        return int(max(plan_times(sig, cost, config, itemsize, choice, [0] * p, faults=False)[2]))
    pods = pods_of(cost) if cost.topology.params.get("superpod_of_server") is not None else None
    return select(Context(sig.name, sig, cost.topology, config, itemsize, servers_of(cost), price,
                          cost.cache("selection"), pods))


def make_plan(sig: Signature, topo, config, entry: list, itemsize: int, trace: bool = False) -> OpPlan:
    """Plan one collective call on `topo` (a Topology or its CostModel) from every rank's entry clock."""
    cost = effective_cost(topo, config)
    p = cost.num_ranks
    choice = choose(sig, cost, config, itemsize)
    retries, history = 0, [(list(entry), None)]
    if cost.link_state:
        (loops, programs, exits, parts), retries, history = priced_with_retry(
            lambda at: plan_times(sig, cost, config, itemsize, choice, at), sig, choice.label, cost, config, entry)
    else:
        loops, programs, exits, parts = plan_times(sig, cost, config, itemsize, choice, entry)
    if sig.name == "barrier":
        # A barrier releases every rank together: when the last rank has heard from all others.
        exits = [max(exits)] * p
    events = None
    if trace:
        events = _trace_events(sig, loops, programs, cost, history)
    nbytes = 0 if sig.name == "barrier" else colls.of(sig.name).op_bytes(sig.count, p, itemsize)
    tries = [list(at) for at, _ in history] if cost.link_state else None
    return OpPlan(sig, choice, loops, programs, list(entry), exits, nbytes, events, parts, retries, tries)


def check_signatures(signatures: list) -> Optional[str]:
    """None if every rank made the same call, else a sentence naming who called what."""
    first = signatures[0]
    if all(s == first for s in signatures):
        return None
    groups = {}
    for r, s in enumerate(signatures):
        groups.setdefault(s, []).append(r)
    parts = [f"rank{'s' if len(rs) > 1 else ''} {_ranks(rs)} called {s.describe()}" for s, rs in groups.items()]
    return "mismatched collective calls across ranks: " + "; ".join(parts)


def _ranks(rs):
    return str(rs[0]) if len(rs) == 1 else ("[" + ", ".join(map(str, rs[:12])) + (", ..." if len(rs) > 12 else "") + "]")
