"""From a collective call to its plan: it only composes. What the collective is comes from
hccl_sim.collectives, which algorithm runs from hccl_sim.selection, how it is built from
hccl_sim.algorithms, and what it costs from the CostModel (hcomm.cost), which owns every cache.

Engine-agnostic and deterministic: every engine (and every rank of a distributed engine) that
plans the same signature with the same entry clocks gets the same plan, which is why simulated
times are identical across engines.

Levels. Hardware topologies run HCCL's hierarchy: level0 inside a server chosen from the
hardware, level1 among the same-index cards of all servers. Synthetic topologies are one flat level.

Loops: as HCCL in op-base mode, data larger than the CCL buffer (HCCL_BUFFSIZE) is processed in
buffer-sized loops; on hardware presets each loop is staged user -> CCL buffer -> user. Loops are
priced in closed form: timing is invariant under a uniform shift, so once full loops move every
rank's clock by the same amount, every further such run of loops does exactly that too.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from hcomm import program as prog
from hcomm.cost import as_cost
from hcomm.vtiming import program_times
from topologies.errors import HcclError
from topologies.presets import without_inter_hccs

from . import algorithms
from . import collectives as colls
from .algorithms import double_ring, grouped_mesh, hierarchy, pipeline, superpod
from .algorithms.common import side_by_side
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

    def describe(self) -> str:
        parts = [f"shape={self.shape}", f"dtype={self.dtype}"]
        if self.redop is not None:
            parts.append(f"op={self.redop}")
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.algo is not None:
            parts.append(f"algo={self.algo!r}")
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


# ---- programs ------------------------------------------------------------------------------------

def servers_of(cost) -> hierarchy.Servers:
    cost = as_cost(cost)
    cache = cost.cache("servers")
    srv = cache.get("servers")
    if srv is None:
        srv = cache["servers"] = hierarchy.Servers(cost.server_of)
    return srv


def pods_of(cost) -> superpod.Pods:
    cost = as_cost(cost)
    cache = cost.cache("servers")
    pods = cache.get("pods")
    if pods is None:
        pods = cache["pods"] = superpod.Pods(servers_of(cost), cost.topology.params["superpod_of_server"])
    return pods


def build_parts(name: str, choice: Choice, topo, length: int, itemsize: int, root) -> list:
    """The unstaged programs of one loop of `length` elements (per block for block collectives),
    as ((start, stop, program), ...) over the loop's elements: one part, or on A3's double ring
    two halves, each with its own ring direction, that run side by side."""
    cost = as_cost(topo)
    if choice.level0 == "double_ring" and not choice.flat and name != "alltoall":
        coll = colls.of(name)
        parts = []
        for k, (a, b) in enumerate(double_ring.halves(length, itemsize)):
            unit = coll.program_unit(b - a, itemsize)
            parts.append((a, b, _superpod_program(name, choice, cost, b - a, unit, root or 0, k)))
        return parts
    return [(0, length, build_program(name, choice, cost, length, itemsize, root))]


def _superpod_program(name, choice, cost, length, unit, root, ring_index) -> list:
    pods = pods_of(cost)
    l1, l2 = choice.level1 or "ring", choice.level2 or "NHR"
    if name == "allreduce":
        return superpod.allreduce(pods, length, unit, l1, l2, ring_index)
    if name == "allgather":
        return superpod.allgather(pods, unit, l1, l2, ring_index)
    if name == "reducescatter":
        return superpod.reducescatter(pods, unit, l1, l2, ring_index)
    if name == "broadcast":
        return superpod.broadcast(pods, length, unit, root, l1, l2, ring_index)
    return superpod.reduce(pods, length, unit, root, l1, l2, ring_index)


def build_program(name: str, choice: Choice, topo, length: int, itemsize: int, root) -> list:
    """The unstaged program of one loop of `length` elements (per block for block collectives)."""
    cost = as_cost(topo)
    p = cost.num_ranks
    root = root or 0
    if name == "barrier":
        return algorithms.flat_program("barrier", "dissemination", p, 0, 0)
    unit = colls.of(name).program_unit(length, itemsize)
    if choice.flat:
        if choice.level1 == "grouped_fullmesh":
            # the SDMA group: the superpod, or the server when HCCL_INTER_HCCS_DISABLE puts RoCE between servers
            inter_hccs = cost.topology.params.get("inter_hccs", True)
            return grouped_mesh.alltoall(pods_of(cost).pod_of_rank if inter_hccs else np.asarray(cost.server_of), unit)
        return algorithms.flat_program(name, choice.level1, p, length, unit, root)
    if cost.topology.params.get("superpod_of_server") is not None:
        return _superpod_program(name, choice, cost, length, unit, root, 0)
    srv = servers_of(cost)
    l0, l1 = choice.level0 or "fullmesh", choice.level1 or "ring"
    if l1 == "pipeline":
        if name == "allreduce":
            return pipeline.allreduce(srv, length, unit)
        return getattr(pipeline, name)(srv, unit)
    if name == "allreduce":
        return hierarchy.allreduce(srv, length, unit, l0, l1)
    if name == "allgather":
        return hierarchy.allgather(srv, unit, l0, l1)
    if name == "reducescatter":
        return hierarchy.reducescatter(srv, unit, l0, l1)
    if name == "broadcast":
        return hierarchy.broadcast(srv, length, unit, root, l0, l1)
    if name == "reduce":
        return hierarchy.reduce(srv, length, unit, root, l0, l1)
    return hierarchy.alltoall(srv, unit)


def loop_program(cost, name, choice, length, itemsize, root) -> list:
    """The program of one loop, staged on hardware presets that stage (cached in the cost model)."""
    return loop_parts(cost, name, choice, length, itemsize, root)[0]


def loop_parts(cost, name, choice, length, itemsize, root) -> tuple:
    """(the timing program of one loop, its data parts or None when it is one part), cached."""
    cache = cost.cache("programs")
    key = (name, choice.structure, length, itemsize, root)
    got = cache.get(key)
    if got is None:
        if name == "barrier":
            parts = [(0, length, build_program(name, choice, cost, length, itemsize, root))]
        else:
            parts = build_parts(name, choice, cost, length, itemsize, root)
        program = side_by_side(*[prog for _, _, prog in parts]) if len(parts) > 1 else parts[0][2]
        if cost.device_model.staging and name != "barrier":
            p = cost.num_ranks
            ins, outs = colls.of(name).stage_bytes(p, length, itemsize, root or 0)
            r = np.arange(p)
            program = ([prog.StepBuilder().stages(r, ins, "in").build()] + list(program)
                       + [prog.StepBuilder().stages(r[outs > 0], outs[outs > 0], "out").build()])
        got = cache[key] = (program, tuple(parts) if len(parts) > 1 else None)
    return got


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


def plan_times(sig, cost, config, itemsize, choice, entry):
    """(loops, programs by loop length, exit clocks) of the op from `entry` clocks."""
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
    return loops, programs, [base + t for t in rel_exits], parts or None


def effective_cost(topo, config):
    """The CostModel a communicator with `config` prices on: on an A3 SuperPoD with
    HCCL_INTER_HCCS_DISABLE=TRUE, that of the topology with RoCE between its servers."""
    cost = as_cost(topo)
    params = cost.topology.params
    if config.inter_hccs_disable and params.get("superpod_of_server") is not None and params.get("inter_hccs", True):
        return as_cost(without_inter_hccs(cost.topology))
    return cost


def choose(sig: Signature, topo, config, itemsize: int) -> Choice:
    """What runs for this call on `topo` (a Topology or its CostModel): selection.select's answer."""
    cost = effective_cost(topo, config)
    p = cost.num_ranks

    def price(choice):
        return int(max(plan_times(sig, cost, config, itemsize, choice, [0] * p)[2]))
    pods = pods_of(cost) if cost.topology.params.get("superpod_of_server") is not None else None
    return select(Context(sig.name, sig, cost.topology, config, itemsize, servers_of(cost), price,
                          cost.cache("selection"), pods))


def make_plan(sig: Signature, topo, config, entry: list, itemsize: int, trace: bool = False) -> OpPlan:
    """Plan one collective call on `topo` (a Topology or its CostModel) from every rank's entry clock."""
    cost = effective_cost(topo, config)
    p = cost.num_ranks
    choice = choose(sig, cost, config, itemsize)
    loops, programs, exits, parts = plan_times(sig, cost, config, itemsize, choice, entry)
    if sig.name == "barrier":
        # A barrier releases every rank together: when the last rank has heard from all others.
        exits = [max(exits)] * p
    events = None
    if trace:
        from hcomm.timing import replay
        events = []
        per_loop = [program_rank_steps(programs[b - a if sig.name != "barrier" else 1], p) for a, b in loops]
        full = [sum((tuple(s) for s in steps), ()) for steps in zip(*per_loop)]
        replay(full, list(entry), cost, dtype=sig.dtype, redop=sig.redop or "sum", events=events)
    nbytes = 0 if sig.name == "barrier" else colls.of(sig.name).op_bytes(sig.count, p, itemsize)
    return OpPlan(sig, choice, loops, programs, list(entry), exits, nbytes, events, parts)


def program_rank_steps(program, p) -> list:
    """Each rank's step list of a program (cached on the program's first step)."""
    if not program:
        return [()] * p
    holder = program[0].cache
    got = holder.get("rank_steps")
    if got is None:
        got = holder["rank_steps"] = prog.rank_steps(program, p)
    return got


def program_moves(program) -> tuple:
    """(serial data moves, whether index-aligned) of a program (cached). Moves of empty slices
    (a tiny op's empty chunks) are dropped: they move nothing, and each costs a numpy call."""
    if not program:
        return [], True
    holder = program[0].cache
    got = holder.get("moves")
    if got is None:
        moves = [m for m in prog.data_moves(program) if m[6] < m[7]]
        got = holder["moves"] = (moves, prog.index_aligned(moves))
    return got


def program_moves_for(program, rank: int) -> list:
    """The moves deciding `rank`'s output in a program (cached): for a rank that has every rank's
    input and needs only its own result (the Ray engine's eager small ops)."""
    if not program:
        return []
    holder = program[0].cache
    key = ("moves_for", rank)
    got = holder.get(key)
    if got is None:
        got = holder[key] = prog.moves_for(program_moves(program)[0], rank, prog.BUFFERS.index("output"))
    return got


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
