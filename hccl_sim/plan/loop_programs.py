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

from .. import algorithms
from .. import collectives as colls
from ..algorithms import double_ring, grouped_mesh, hierarchy, pipeline, registry, superpod, uneven
from ..algorithms.common import side_by_side
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
    if name == "scatter":                  # level0 and level1 of HCCL's Scatter executors, A3's too
        return hierarchy.scatter(servers_of(cost), unit, root, choice.level0 or "fullmesh", choice.level1 or "ring")
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


def build_variable(name: str, choice: Choice, topo, v, a: int, b: int, itemsize: int) -> list:
    """The unstaged program of loop [a, b) of a variable-size op with counts `v` (VCounts): the
    algorithm selection chose for the collective it follows, each pair moving its own count."""
    cost = as_cost(topo)
    coll = colls.of(name)
    if coll.stages_itself:
        return _one_count_per_block(coll, choice, cost, v, a, b, itemsize)
    lengths, soff, doff = coll.round_blocks(v, a, b)
    blocks = (lengths, soff, doff)
    if choice.flat:
        if choice.level1 == "grouped_fullmesh":
            inter_hccs = cost.topology.params.get("inter_hccs", True)
            group_of = pods_of(cost).pod_of_rank if inter_hccs else np.asarray(cost.server_of)
            return grouped_mesh.alltoallv(group_of, blocks, itemsize)
        if choice.level1 == "fullmesh":
            return algorithms.mesh.alltoallv(blocks, itemsize)
        return algorithms.pairwise.alltoallv(blocks, itemsize)
    return hierarchy.alltoallv(servers_of(cost), blocks, itemsize)


def _one_count_per_block(coll, choice, cost, v, a, b, itemsize) -> list:
    """Loop [a, b) of AllGatherV or ReduceScatterV (one count per rank block): the block algorithm
    selection chose, on the loop's blocks (algorithms.uneven), with HCCL's staging around it."""
    lengths = np.clip(coll.block_counts(v) - a, 0, b - a)
    user_lo = coll.block_displs(v) + a
    p = len(lengths)
    gathering = coll.selects_as == "allgather"
    if choice.flat:
        mod = registry.module(choice.level1)
        anywhere = choice.level1 in ("ring", "fullmesh")        # they take blocks anywhere
        if gathering:
            def run(buf, offs):
                return mod.allgather(p, offs, itemsize, buf)
        else:
            def run(src, offs, acc, out, out_lo):
                return mod.reducescatter(p, offs, itemsize, src, acc, out, out_lo)
    else:
        srv = servers_of(cost)
        l0, l1 = choice.level0 or "fullmesh", choice.level1 or "ring"
        anywhere = srv.m <= 1                                    # level0 alone: the mesh or the ring
        run = (hierarchy.allgather_blocks if gathering else hierarchy.reducescatter_blocks)(srv, itemsize, l0, l1)
    build = uneven.allgatherv if gathering else uneven.reducescatterv
    program, in_place = build(lengths, user_lo, a, itemsize, run, anywhere)
    if cost.device_model.staging:
        ins, outs = coll.stage_bytes_v(v, a, b, itemsize, servers_of(cost).m, in_place)
        program = _staged(program, ins, outs)
    return program


def _staged(program, ins, outs) -> list:
    """The program between its CCL-buffer copies: `ins` bytes per rank before, `outs` after."""
    r = np.arange(len(ins))
    before = [prog.StepBuilder().stages(r[ins > 0], ins[ins > 0], "in").build()] if (ins > 0).any() else []
    after = [prog.StepBuilder().stages(r[outs > 0], outs[outs > 0], "out").build()] if (outs > 0).any() else []
    return before + list(program) + after


def loop_program(cost, name, choice, length, itemsize, root) -> list:
    """The program of one loop, staged on hardware presets that stage (cached in the cost model)."""
    return loop_parts(cost, name, choice, length, itemsize, root)[0]


def loop_parts(cost, name, choice, length, itemsize, root, v=None) -> tuple:
    """(the timing program of one loop, its data parts or None when it is one part), cached.
    `v`: a variable-size op's (VCounts, the loop's first element of every block)."""
    cache = cost.cache("programs")
    key = (name, choice.structure, length, itemsize, root, v)
    got = cache.get(key)
    if got is None and v is not None:
        counts, a = v
        program = build_variable(name, choice, cost, counts, a, a + length, itemsize)
        if cost.device_model.staging and not colls.of(name).stages_itself:
            p = cost.num_ranks
            ins, outs = colls.of(name).stage_bytes_v(counts, a, a + length, itemsize)
            r = np.arange(p)
            program = ([prog.StepBuilder().stages(r[ins > 0], ins[ins > 0], "in").build()] + list(program)
                       + [prog.StepBuilder().stages(r[outs > 0], outs[outs > 0], "out").build()])
        got = cache[key] = (program, None)
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


def program_rank_steps(program, p) -> list:
    """Each rank's step list of a program (kept with the program's lowering, hcomm.exec.LoopBody)."""
    return LoopBody.of(program).rank_steps(p)


def op_overhead_ns(dm, name: str) -> int:
    """The preset's fixed cost of one call of `name` (a variant without one of its own: the cost
    of the collective it follows, AlltoAll for AlltoAllV)."""
    got = dm.op_overhead_ns.get(name)
    return got if got is not None else dm.op_overhead_ns.get(colls.of(name).selection_name(), 0)


def program_of(programs: dict, a: int, b: int):
    """The program of loop [a, b): by its length, or for a variable-size op by the loop itself."""
    got = programs.get((a, b))
    return programs[b - a] if got is None else got
