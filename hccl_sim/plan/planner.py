"""From a collective call to its plan: it only composes. What the collective is comes from
hccl_sim.collectives, which algorithm runs from hccl_sim.selection, the program of a loop from
hccl_sim.plan.loop_programs (over hccl_sim.algorithms), and what it costs from the CostModel (hcomm.cost),
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

Faults: an op that a fault plan's link change meets, or that holds a corrupted transfer (the
communicator's hccl_sim.faults.progress says which), is priced by the event-driven replay from its
absolute clocks, with op retry (hccl_sim.faults.retry) when a transfer's retransmissions run out; after an
A3 backup-NIC switch the op and every later one run on the borrowed routes.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from hcomm.vtiming import program_times
from topologies.errors import HcclError

from .. import collectives as colls
from ..algorithms import omnipipe, registry
from ..faults.progress import NO_FAULTS, OpFaults, link_setup_starved
from ..faults.retry import priced_with_retry
from .costs import effective_cost, priced_as
from .loop_programs import LoopBuilder, op_overhead_ns, pods_of, servers_of
from .event_replay import LOOPS_REPLAYED, replayed_exits, sends, trace_events
from .faulted import late_entry_error, link_setup_failed
from ..selection import Choice, Context, select



class Signature(NamedTuple):
    """What every rank must agree on for a collective call."""
    name: str                 # "allreduce", ...
    shape: tuple
    dtype: str
    redop: Optional[str]
    root: Optional[int]
    algo: Optional[str]       # the algo= argument as given
    inplace: bool = False     # out= aliases the input (HCCL's sendBuf == recvBuf): no op retry
    # variable-size ops (collectives.variable): the op's per-pair counts once the rendezvous has
    # merged every rank's `local` (its own rows of counts and displacements, which differ by rank;
    # `shape` is then the row shape)
    v: object = None
    local: Optional[tuple] = None

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
        parts += colls.of(self.name).describe_counts(self)
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
    retries: int = 0               # op retries a link failure cost (hccl_sim.faults.retry)
    transfers: Optional[dict] = None   # (src, dst) -> the op's transfers on each pair a corrupt entry counts
    backup: tuple = ()             # dies on their partner's NIC when the op ends (A3's backup NIC)
    notes: tuple = ()              # what the fault machinery did that last_op reports (a backup NIC used)
    corrupt: Optional[dict] = None     # {(src, dst, k): label}: the op's transfers that fail their CRC
    tries: Optional[list] = None   # every try's (entry clocks, backup dies), first to last (under a fault plan)

    @functools.cached_property
    def algo(self) -> str:
        """What ran, e.g. "ring" or "level0:fullmesh;level1:NHR" (with HCCL's fallback, if any)."""
        return self.choice.label

    @property
    def collective(self) -> colls.Collective:
        return colls.of(self.signature.name)

    def exit_of(self, rank: int) -> int:
        """Rank `rank`'s exit clock, ns."""
        return self.exits[rank]

    @property
    def unshifted(self) -> "OpPlan":
        """The plan whose clocks this one's are (itself: see ShiftedPlan)."""
        return self

    base = 0                           # ns its clocks are shifted by (see ShiftedPlan)

    @functools.cached_property
    def data(self):
        """The op's DataProgram (hcomm.exec): what every byte mover runs, lowered once."""
        from .lowering import lower
        return lower(self)

    def loop_programs(self):
        """((start, stop), program) of every loop, in order: what the data engines execute. A loop
        the double ring halves is its two halves' programs (columns apart, so in any order)."""
        parts = self.parts
        for a, b in self.loops:
            split = parts.get(b - a) if parts else None
            if split is None:
                yield (a, b), self.programs[self.loops.key(a, b)]
            else:
                for lo, hi, program in split:
                    yield (a + lo, a + hi), program


class ShiftedPlan:
    """A cached plan moved by `base` ns: what the plan of the shifted call is (timing is
    shift-invariant, and only plans no link fault or corrupted transfer meets are cached), without
    copying it. It reads as an OpPlan: entry, exit and every try's clocks are shifted when read;
    the data it moves is its plan's."""
    __slots__ = ("plan", "base", "signature", "choice", "loops", "programs", "nbytes", "events", "retries",
                 "transfers", "backup", "notes", "corrupt", "parts")

    def __init__(self, plan: OpPlan, base: int):
        self.plan, self.base = plan, base
        self.signature, self.choice, self.loops, self.programs = plan.signature, plan.choice, plan.loops, plan.programs
        self.nbytes, self.events, self.retries, self.parts = plan.nbytes, plan.events, plan.retries, plan.parts
        self.transfers, self.backup, self.notes, self.corrupt = plan.transfers, plan.backup, plan.notes, plan.corrupt

    @property
    def entry(self):
        return [self.base + t for t in self.plan.entry]

    @property
    def exits(self):
        return [self.base + t for t in self.plan.exits]

    @property
    def tries(self):
        tries = self.plan.tries
        return None if tries is None else [([self.base + t for t in at], dies) for at, dies in tries]

    def exit_of(self, rank: int) -> int:
        return self.base + self.plan.exits[rank]

    @property
    def algo(self) -> str:
        return self.plan.algo

    @property
    def collective(self):
        return self.plan.collective

    @property
    def data(self):
        return self.plan.data

    @property
    def unshifted(self) -> OpPlan:
        return self.plan

    def loop_programs(self):
        return self.plan.loop_programs()


def op_loops(sig: Signature, p: int, itemsize: int, config, modules: int = 1) -> colls.Loops:
    coll = colls.of(sig.name)
    colls.check_op_bytes(coll.buffer_bytes(sig, p, itemsize))
    return coll.loops_of(sig, p, itemsize, config.buffsize_bytes, modules)


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
    if not loops.closed_form:              # every loop a program of its own (a variable-size op's)
        for k, (a, b) in enumerate(loops):
            clock = program_times(programs[loops.key(a, b)], clock + (again if k else 0), cost, dtype, redop)
        return clock
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
        if done >= LOOPS_REPLAYED:
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


def op_programs(sig, cost, config, itemsize, choice):
    """(loops, programs by loop length, data parts or None) of the op (programs cached in the cost model)."""
    problem = colls.of(sig.name).priced_choice_problem(cost.num_ranks, choice)
    if problem:
        raise HcclError("E_PARA", f"{sig.name}: {problem}")
    # servers the CCL buffer is shared across (AllGatherV's loops; a synthetic topology is one server)
    loops = op_loops(sig, cost.num_ranks, itemsize, config, servers_of(cost).m)
    own = registry.get(choice.level1).loop_block_bytes if choice.flat and choice.level1 else None
    if own is not None and loops.per:         # the algorithm cuts the blocks into loops its own way
        loops = loops.with_cap(max(1, own(config.buffsize_bytes) // itemsize))
    if choice.pipelined and loops.per:        # the 950's PipeLine sizes its loops its own way
        loops = loops.with_cap(omnipipe.loop_elements(sig.name, pods_of(cost).shape, loops.per, itemsize,
                                                      config.buffsize_bytes))
    if not loops.closed_form and len(loops) > LOOPS_REPLAYED:
        raise HcclError("E_NOT_SUPPORT", f"{sig.describe()}: {len(loops)} buffer loops, over the "
                        f"{LOOPS_REPLAYED} a variable-size op is priced loop by loop; use a larger HCCL_BUFFSIZE")
    builder = LoopBuilder(cost, sig.name, choice, itemsize, sig.root)
    built = {key: loops.build(key, builder) for key, _ in loops.uses()}
    parts = {key: got[1] for key, got in built.items() if got[1] is not None}
    return loops, {key: got[0] for key, got in built.items()} or loops.no_programs(), parts or None


def plan_times(sig, cost, config, itemsize, choice, entry, faults: bool = True, corrupt: Optional[dict] = None):
    """(loops, programs by loop length, exit clocks, data parts) of the op from `entry` clocks.

    Fault-free prices are cached by relative entry clocks (timing is shift-invariant). Under a
    link state (a fault plan) an op whose fault-free span meets a change, or that holds a
    corrupted transfer (`corrupt`, {(src, dst, k): label}, consumed as they are transmitted), is
    re-priced by the event-driven replay from its absolute clocks, which retransmits over down
    links and may raise hcomm.link_state.LinkFailure; an op no fault meets is exactly its fault-free self."""
    cost = priced_as(cost, choice)
    loops, programs, parts = op_programs(sig, cost, config, itemsize, choice)
    cache = cost.cache("timings")
    at = np.asarray(entry, dtype=np.int64)
    base = int(at.min()) if len(at) else 0
    rel = at - base
    key = (sig.name, sig.shape, sig.dtype, sig.redop, sig.root, choice.structure, config.buffsize_bytes, itemsize,
           rel.tobytes(), sig.v)
    rel_exits = cache.get(key)
    if rel_exits is None:
        # the op's fixed host-side cost (expansion and launch) delays every rank before its first step
        start = rel + op_overhead_ns(cost.device_model, sig.name)
        rel_exits = cache[key] = _time_loops(loops, programs, start, cost, sig.dtype, sig.redop or "sum")
        rel_exits.setflags(write=False)
    exits = (rel_exits + base).tolist()
    links = cost.link_state
    if faults and (corrupt or (links and links.affects(base, max(exits, default=base)))):
        exits = replayed_exits(sig, loops, programs, entry, cost, corrupt=corrupt)
    return loops, programs, exits, parts


def op_transfers(sig, loops, programs, p: int, pairs) -> dict:
    """(src, dst) -> the op's transfers on each pair: every loop's, in loop order."""
    out = {}
    uses = loops.uses()
    for src, dst in pairs:
        out[(src, dst)] = sum(n * sends(programs[key], p, src, dst) for key, n in uses)
    return out


def choose(sig: Signature, topo, config, itemsize: int) -> Choice:
    """What runs for this call on `topo` (a Topology or its CostModel): selection.select's answer."""
    cost = effective_cost(topo, config)
    p = cost.num_ranks

    def price(choice):
        return int(max(plan_times(sig, cost, config, itemsize, choice, [0] * p, faults=False)[2]))
    pods = pods_of(cost) if cost.topology.params.get("superpod_of_server") is not None else None
    coll = colls.of(sig.name)
    return select(Context(coll.selection_name(), coll.selection_signature(sig), cost.topology, config, itemsize,
                          servers_of(cost), price, cost.cache("selection"), pods, call=sig))


def make_plan(sig: Signature, topo, config, entry: list, itemsize: int, trace: bool = False,
              faults_now: Optional[OpFaults] = None) -> OpPlan:
    """Plan one collective call on `topo` (a Topology or its CostModel) from every rank's entry clock;
    `faults_now`: what the communicator's fault progress says about this op (hccl_sim.faults.progress)."""
    late = late_entry_error(sig.name, config, entry)
    if late is not None:
        raise late
    now = faults_now or NO_FAULTS
    cost = effective_cost(topo, config, now.backup)
    p = cost.num_ranks
    choice = choose(sig, cost, config, itemsize)
    starved = link_setup_starved(now, sig, choice.label)
    if starved:                             # an hbm_pressure leaves some rank's link setup no memory
        raise link_setup_failed(sig, choice.label, starved, cost, config)
    transfers, corrupt = None, {}
    if now.corrupt:
        loops, programs, _ = op_programs(sig, cost, config, itemsize, choice)
        transfers = op_transfers(sig, loops, programs, p, sorted({(a, b) for a, b, _, _ in now.corrupt}))
        corrupt = {(a, b, k): label for a, b, k, label in now.corrupt if k < transfers[(a, b)]}
    retries, history, backup, notes = 0, [(list(entry), None, now.backup)], now.backup, ()
    if config.faults is not None:
        remaining = dict(corrupt)           # a corrupted transfer loses one attempt, in whichever try meets it

        def price(at, dies):
            return plan_times(sig, effective_cost(topo, config, dies), config, itemsize, choice, at, corrupt=remaining)
        (loops, programs, exits, parts), retries, history, backup, notes = priced_with_retry(
            price, sig, choice.label, cost, config, entry, now.backup)
    else:
        loops, programs, exits, parts = plan_times(sig, cost, config, itemsize, choice, entry)
    if colls.of(sig.name).releases_together:
        # A barrier releases every rank together: when the last rank has heard from all others.
        exits = [max(exits)] * p
    events = None
    if trace:
        events = trace_events(sig, loops, programs, topo, config, history, corrupt, choice)
    nbytes = colls.of(sig.name).bytes_of(sig, p, itemsize)
    tries = [(list(at), dies) for at, _, dies in history] if config.faults is not None else None
    return OpPlan(sig, choice, loops, programs, list(entry), exits, nbytes, events, parts, retries, transfers,
                  backup, notes, corrupt or None, tries)


def merge_signatures(signatures: list) -> list:
    """Every rank's signature as the op is planned: a variable-size op's rows of counts (each
    rank's `local`) merged into the op's VCounts (collectives.variable.merge: E_PARA naming both
    ranks and both counts where a pair disagrees); other signatures as they are. Calls that
    differ otherwise are left for check_signatures to name."""
    return colls.of(signatures[0].name).merged_signatures(signatures)


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
