"""The program of one loop of a collective call: from what selection chose (a Choice) to the
steps every rank runs, built by hccl_sim.algorithms and cached in the cost model, which owns every
cache.

Hardware topologies run HCCL's hierarchy (algorithms.hierarchy; on an A3 SuperPoD,
algorithms.superpod, whose double ring gives a loop two halves that run side by side: the timing
program holds both, the data engines run them one after another); synthetic ones one flat
algorithm. On presets that stage, a loop's program starts and ends with its CCL-buffer copies.
"""
from __future__ import annotations

import numpy as np

from hcomm import program as prog
from hcomm.cost import as_cost
from hcomm.exec import LoopBody

from .. import collectives as colls
from ..algorithms import double_ring, hierarchy, omnipipe, registry, superpod
from ..algorithms.common import relabel_rows, side_by_side
from ..selection import Choice

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


class Levels:
    """What a collective's program hooks (collectives.base.Collective.program) read of a cost model:
    its rank count, servers, superpods (None off an A3 SuperPoD) and SDMA groups, each built when
    first asked (and cached in the cost model)."""
    __slots__ = ("cost",)

    def __init__(self, cost):
        self.cost = cost

    @property
    def p(self) -> int:
        return self.cost.num_ranks

    @property
    def servers(self) -> hierarchy.Servers:
        return servers_of(self.cost)

    @property
    def pods(self):
        return pods_of(self.cost) if self.cost.topology.params.get("superpod_of_server") is not None else None

    @property
    def staging(self) -> bool:
        return self.cost.device_model.staging

    @property
    def sdma_groups(self):
        """Each rank's SDMA group: its superpod, or its server when HCCL_INTER_HCCS_DISABLE puts RoCE
        between servers."""
        if self.cost.topology.params.get("inter_hccs", True):
            return pods_of(self.cost).pod_of_rank
        return np.asarray(self.cost.server_of)


def build_parts(name: str, choice: Choice, topo, length: int, itemsize: int, root) -> list:
    """The unstaged programs of one loop of `length` elements (per block for block collectives),
    as ((start, stop, program), ...) over the loop's elements: one part, or on A3's double ring
    two halves, each with its own ring direction, that run side by side."""
    cost = as_cost(topo)
    coll = colls.of(name)
    if choice.split is not None:
        return _parallel_parts(coll, choice, cost, length, itemsize, root or 0)
    if choice.pipelined:            # OmniPipe's data parts (its timing program: loop_parts)
        return omnipipe.loop(name, pods_of(cost).M, length, itemsize).parts
    chunked = registry.get(choice.level1).block_parts if choice.flat and choice.level1 else None
    if chunked is not None and coll.block:      # the algorithm cuts each block into parts
        return chunked(cost.num_ranks, length, itemsize)
    if choice.level0 == "double_ring" and not choice.flat and coll.double_ring:
        pods = pods_of(cost)
        return [(a, b, coll.superpod_program(pods, choice, b - a, coll.program_unit(b - a, itemsize), root or 0, k))
                for k, (a, b) in enumerate(double_ring.halves(length, itemsize))]
    return [(0, length, build_program(name, choice, cost, length, itemsize, root))]


def _parallel_parts(coll, choice: Choice, cost, length: int, itemsize: int, root: int) -> list:
    """The 950's Parallel executor (docs/references.md §6.13): the first `choice.split` of the
    data runs the levels in order (the server's mesh, then across servers), the rest across
    servers first (Pods.transposed: NHR among a server's same-index ranks, then the mesh), the
    two parts side by side, so the mesh links and the Clos ports work at once. A split of 0 or 1
    (HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO) runs the whole data in one of the two orders."""
    pods = pods_of(cost).squeezed() if choice.squeezed else pods_of(cost)
    a = int(length * choice.split)
    if a in (0, length) and 0 < choice.split < 1:       # too short to split: the levels in order
        return [(0, length, coll.superpod_program(pods, choice, length, coll.program_unit(length, itemsize), root, 0))]
    across_first = choice._replace(level0=choice.level1, level1=choice.level0)
    transposed = pods.transposed()
    parts = [(0, a, pods, choice), (a, length, transposed, across_first)]
    out = []
    for lo, hi, view, levels in parts:
        if hi > lo:
            program = coll.superpod_program(view, levels, hi - lo, coll.program_unit(hi - lo, itemsize), root, 0)
            if view is transposed and coll.rank_rows is not None:   # a block op: rows back to the ranks'
                program = relabel_rows(program, coll.rank_rows, transposed.M.reshape(-1))
            out.append((lo, hi, program))
    return out


def build_program(name: str, choice: Choice, topo, length: int, itemsize: int, root) -> list:
    """The unstaged program of one loop of `length` elements (per block for block collectives):
    what the collective's class builds on the levels selection chose."""
    coll = colls.of(name)
    return coll.program(choice, Levels(as_cost(topo)), length, coll.program_unit(length, itemsize), root or 0)


def build_variable(name: str, choice: Choice, topo, v, a: int, b: int, itemsize: int) -> list:
    """The program of loop [a, b) of a variable-size op with counts `v` (VCounts): what the
    collective's class builds (AllGatherV and ReduceScatterV with their own staging)."""
    return colls.of(name).v_program(choice, Levels(as_cost(topo)), v, a, b, itemsize)


def loop_program(cost, name, choice, length, itemsize, root) -> list:
    """The program of one loop, staged on hardware presets that stage (cached in the cost model)."""
    return loop_parts(cost, name, choice, length, itemsize, root)[0]


def loop_parts(cost, name, choice, length, itemsize, root) -> tuple:
    """(the timing program of one loop of `length` elements, its data parts or None when it is one
    part), staged on presets that stage; cached in the cost model."""
    cache = cost.cache("programs")
    key = (name, choice.structure, length, itemsize, root, None)
    got = cache.get(key)
    if got is None:
        if choice.pipelined:            # the 950's OmniPipe: its own timing program beside its data parts
            program, parts = omnipipe.loop(name, pods_of(cost).M, length, itemsize)
        else:
            parts = build_parts(name, choice, cost, length, itemsize, root)
            program = side_by_side(*[prog for _, _, prog in parts]) if len(parts) > 1 else parts[0][2]
        if cost.device_model.staging and colls.of(name).carries_data and _staged(choice):   # a barrier stages nothing
            p = cost.num_ranks
            ins, outs = colls.of(name).stage_bytes(p, length, itemsize, root or 0)
            r = np.arange(p)
            program = ([prog.StepBuilder().stages(r, ins, "in").build()] + list(program)
                       + [prog.StepBuilder().stages(r[outs > 0], outs[outs > 0], "out").build()])
        # data runs the parts where they are not the timing program itself (OmniPipe's never are)
        got = cache[key] = (program, tuple(parts) if len(parts) > 1 or choice.pipelined else None)
    return got


def _staged(choice: Choice) -> bool:
    """Whether what runs goes through the CCL buffer: not an algorithm that reads and writes the
    user's buffers itself (algorithms.registry's `staged`)."""
    return not choice.flat or registry.get(choice.level1).staged


def variable_loop_parts(cost, name, choice, v, a: int, b: int, itemsize, root) -> tuple:
    """(the timing program of loop [a, b) of a variable-size op with counts `v`, None): its
    collective's program, staged as the collective says on presets that stage; cached."""
    cache = cost.cache("programs")
    key = (name, choice.structure, b - a, itemsize, root, (v, a))
    got = cache.get(key)
    if got is None:
        program = build_variable(name, choice, cost, v, a, b, itemsize)
        staged = colls.of(name).v_staging(v, a, b, itemsize) if cost.device_model.staging and _staged(choice) else None
        if staged is not None:
            ins, outs = staged
            r = np.arange(cost.num_ranks)
            program = ([prog.StepBuilder().stages(r[ins > 0], ins[ins > 0], "in").build()] + list(program)
                       + [prog.StepBuilder().stages(r[outs > 0], outs[outs > 0], "out").build()])
        got = cache[key] = (program, None)
    return got


class LoopBuilder:
    """What an op's loops (collectives' Loops, PerLoop) build their programs with: `fixed(length)`
    a loop of that many elements, `variable(v, a, b)` loop [a, b) of a variable-size op."""
    __slots__ = ("cost", "name", "choice", "itemsize", "root")

    def __init__(self, cost, name, choice, itemsize, root):
        self.cost, self.name, self.choice, self.itemsize, self.root = cost, name, choice, itemsize, root

    def fixed(self, length: int) -> tuple:
        return loop_parts(self.cost, self.name, self.choice, length, self.itemsize, self.root)

    def variable(self, v, a: int, b: int) -> tuple:
        return variable_loop_parts(self.cost, self.name, self.choice, v, a, b, self.itemsize, self.root)


def program_rank_steps(program, p) -> list:
    """Each rank's step list of a program (kept with the program's lowering, hcomm.exec.LoopBody)."""
    return LoopBody.of(program).rank_steps(p)


def op_overhead_ns(dm, name: str) -> int:
    """The preset's fixed cost of one call of `name` (a variant without one of its own: the cost
    of the collective it follows, AlltoAll for AlltoAllV)."""
    got = dm.op_overhead_ns.get(name)
    return got if got is not None else dm.op_overhead_ns.get(colls.of(name).selection_name(), 0)

