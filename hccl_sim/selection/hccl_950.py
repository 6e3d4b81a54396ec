"""HCCL's selection on the Ascend 950 (DEV_TYPE_950): the open-source HCCL's rule-based auto
selectors, AICPU_TS engine (hicann/hccl @09300b70, src/ops/<op>/selector/*_auto_selector.cc;
docs/references.md §6.13), which run on a 950 unless HCCL_USE_NEW_SELECTOR=1.

Levels as HCCL counts them (topoLevelNums): one server L = 1; servers of one SuperPoD L = 2;
several SuperPoDs L = 3. A choice is HCCL's algorithm name (`Choice.executor`) and the levels
hccl-sim runs for it:

- `...SoleMesh`, `...SoleMeshTwoShot` (one server): the full mesh (algorithms.mesh: RS + AG,
  scatter + AG, RS + gather); `...SoleMeshOneShot` / AicpuReduceSoleMesh: algorithms.mesh_oneshot.
- `...SoleNHR` (flat over every rank: small data across servers, one rank per server, servers of
  unequal size, 64-bit and PROD reductions as `...SoleNHRAicpuReduce`): algorithms.nhr.
- `...Sequence...` across servers: the levels one after another (algorithms.superpod with the
  mesh at level0, NHR at level1 and level2); `...PipeLine` (AllGather, ReduceScatter, AllReduce)
  as HCCL's OmniPipe slices it (Choice.pipelined, algorithms.omnipipe).
- AicpuAllToAll(V)SoleMesh(SingleChannel): HCCL's template over every rank, 16 peers a round
  (algorithms.mesh_rounds).
- `...Parallel...`: the data split in two, one part the levels in order, the other across servers
  first, side by side (_PARALLEL_SPLITS: each op's split as HCCL computes it); across UBoE
  SuperPoDs on a SuperPoD and across (_squeezed).
- `...MeshConcur...`: the level0 mesh as HCCL's Z-axis detour templates run it, part of each
  pair's bytes through the Clos (Choice.detour, priced on topologies.presets.with_detour).
- `...SoleMeshChunk` (ReduceScatter), `...SoleMeshChunkTwoShot` (AllReduce): algorithms.mesh_chunk.
Where HCCL's executor does more than hccl-sim runs, the label says what is not modelled: the
AlltoAll channel count (SingleChannel).
HCCL_OP_EXPANSION_MODE=CCU_MS, CCU_SCHED and AIV try HCCL's CCU and AIV selectors first
(selection.hccl_950_kernels), which fall back here.
"""
from __future__ import annotations

import math

from .. import collectives as colls
from ..algorithms import mesh_chunk, omnipipe, registry

MiB, GiB = 1 << 20, 1 << 30
SPECIAL_TYPES = ("int64", "uint64", "float64")      # "special": reduced on the AI CPU (AicpuReduce)
FLAT_ALWAYS = ("alltoall", "alltoallv", "alltoallvc")     # the mesh over every rank, whatever the levels
V_FLAT = ("allgatherv", "reducescatterv")                 # their one mesh over every rank, likewise
UNLIKE = {"Parallel": "the parallel split of the data over the mesh and the Clos at once is not modelled",
          "SingleChannel": "one channel per peer, as the mesh runs"}


def _op(name: str) -> str:
    """HCCL's op fragment of a collective (AllReduce, AllGatherV, ...)."""
    from ..config.alg_parse import OP_TYPES
    return OP_TYPES[name]


class Shape:
    """What HCCL's 950 selectors read of a call: levels, ranks, sizes."""

    def __init__(self, ctx):
        srv, pods = ctx.servers, ctx.pods
        self.name = ctx.name
        self.n = ctx.topo.num_ranks
        self.servers = srv.m
        self.equal = srv.equal
        self.per_server = srv.K if srv.equal else 0
        self.pods = pods.shape if srv.equal else None          # (N2, N1, N0), logical superpods
        self.superpods = len(set(ctx.topo.params["superpod_of_server"]))
        self.L = 1 if self.servers == 1 else (2 if self.superpods <= 1 else 3)
        # HCCL's level2Uboe: the fabric between SuperPoDs is UBoE (topo_host.cc CalcLevel2Uboe)
        self.uboe = ctx.topo.params.get("inter_spec", {}).get("kind") == "UBoE"
        total = math.prod(ctx.signature.shape) * ctx.itemsize
        coll = colls.of(ctx.name)
        # dataSize per rank, as the selectors take it: an AllGather's send, a ReduceScatter's
        # receive, a vector op's whole buffer
        self.d = total // self.n if coll.block and coll.input_is_block is False else total
        sig = ctx.signature
        self.special = sig.dtype in SPECIAL_TYPES or sig.redop == "prod"
        self.clos_ports = int(ctx.topo.params.get("superpod_ports", 1))
        # IsTwoLevelNetLayer (auto_selector_base.cc): the NPUs also sit behind a Clos (net layer 1)
        # and level0 has more than one rank: HCCL reads the physical layers, so a comm inside one
        # server of a SuperPoD has it too
        self.clos = _has_clos(ctx.topo)
        self.two_level_net = self.clos and (self.per_server > 1 if srv.equal else True)


VARIANTS = ("allgatherv", "reducescatterv", "alltoallv", "alltoallvc")
"""The variants the 950's HCCL selects by their own selectors (each op type registers one)."""


def op_of(ctx) -> str:
    """The op HCCL's 950 selector is registered for: a variant's own (AllGatherV), where hccl-sim
    selects it as the collective it follows elsewhere."""
    own = ctx.own_signature.name
    return own if own in VARIANTS else ctx.name


def _name(ctx, executor: str, templates: str) -> str:
    return f"Aicpu{_op(op_of(ctx))}{executor}{templates}"


def _flat(ctx, algo: str, hccl_name: str, notes=()):
    """`algo` over every rank (ring where hccl-sim does not build the op with it: NHR's Reduce)."""
    from . import Choice
    if not registry.get(algo).runs_flat(ctx.name):
        instead = next(a for a in ("ring", "fullmesh") if registry.supports(a, ctx.name, "flat"))
        notes = list(notes) + [f"hccl-sim's {algo} builds no {ctx.name}: {instead}"]
        algo = instead
    detour = _detour(_has_clos(ctx.topo), hccl_name, ctx.topo.num_ranks)
    if detour is not None:
        notes = list(notes) + [_detour_note(detour)]
    return Choice(True, None, algo, _note(hccl_name, notes), executor=hccl_name, detour=detour)


def _has_clos(topo) -> bool:
    """Whether the NPUs also reach one another through a SuperPoD's Clos (HCCL's level1 channels
    between level0 peers): a preset with a SuperPoD fabric (its ports' count, a sub-communicator's
    too)."""
    return "superpod_ports" in topo.params


def _detour(clos: bool, hccl_name: str, level0: int):
    """(mesh share, peers) of HCCL's Z-axis detour templates, the level0 of every MeshConcur
    executor (Mesh1DZAxisDetour: level0DataRatio 0.25 for two ranks, else 0.5, where the peers
    are also reached through the Clos; §6.13), or None."""
    if "MeshConcur" not in hccl_name or level0 < 2 or not clos:
        return None
    return (0.25 if level0 == 2 else 0.5), level0 - 1


def _detour_note(detour) -> str:
    return f"level0: {detour[0]:g} of each pair's bytes over the mesh, the rest through the Clos (the Z axis)"


def parallel_split(shape) -> float:
    """The share of the data HCCL's Parallel executor runs mesh first (CalcParallelDataSplitRatio,
    template_utils.cc, the ReduceScatter form, as AllReduce's reduce-scatter half runs it; §6.13):
    mesh = 21 (n0 - 1) / (20 n0 P0), Clos = (n1 - 1) / (n1 P1), with P0 the mesh links (one per
    peer) and P1 the NPU's Clos ports; r = Clos / (Clos + mesh), to the nearest eighth in
    [1/8, 7/8]: each part's first phase then takes about as long as the other's."""
    N2, N1, N0 = shape.pods
    mesh_cost = 21 * (N0 - 1) / (20 * N0 * (N0 - 1))
    clos_cost = (N1 - 1) / (N1 * shape.clos_ports)
    return _eighths(clos_cost / (clos_cost + mesh_cost))


def scatter_split(shape) -> float:
    """The share of a Broadcast HCCL's Parallel executor runs mesh first (CalcParallelDataSplitRatio,
    the SCATTER form: mesh = (n0 - 1) / (n0 P0), Clos = (n1 - 1) / (n1 P1), no cap; to the nearest
    eighth in [1/8, 7/8]; ins_v2_broadcast_parallel_executor.cc, §6.13)."""
    N2, N1, N0 = shape.pods
    mesh_cost = (N0 - 1) / (N0 * (N0 - 1))
    clos_cost = (N1 - 1) / (N1 * shape.clos_ports)
    return _eighths(clos_cost / (clos_cost + mesh_cost))


def _broadcast_split(ctx, shape) -> float:
    """A Broadcast's Parallel share mesh first: HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO where set,
    else the SCATTER form."""
    given = ctx.config.split_ratio
    return scatter_split(shape) if given is None else given


def _half(ctx, shape) -> float:
    """A Scatter's Parallel split: half and half, whatever is set (ins_v2_scatter_parallel_executor.cc)."""
    return 0.5


def _eighths(r: float) -> float:
    """QuantizeParallelDataSplitRatio: to the nearest eighth, within [1/8, 7/8]."""
    return min(max(round(r * 8), 1), 7) / 8


def allgather_split(shape) -> float:
    """The share of an AllGather HCCL's Parallel executor runs mesh first (CalcParallelDataSplitRatio,
    the ALL_GATHER form: mesh = (n0 - 1) / P0, Clos = (n1 - 1) / P1; r = Clos / (Clos + mesh) at
    most 0.5, then to the nearest eighth; template_utils.cc)."""
    N2, N1, N0 = shape.pods
    mesh_cost = (N0 - 1) / max(N0 - 1, 1)          # P0: one mesh link per peer
    clos_cost = (N1 - 1) / shape.clos_ports
    return _eighths(min(clos_cost / (clos_cost + mesh_cost), 0.5))


def _allgather_split(ctx, shape) -> float:
    """An AllGather's Parallel share mesh first: HCCL's formula, or 1 minus
    HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO, which an AllGather takes as its share across servers
    first (InsV2AllGatherParallelExecutor::GetParallelDataSplit)."""
    given = ctx.config.split_ratio
    return allgather_split(shape) if given is None else 1.0 - given


def modelled_split(ctx, shape, hccl_name: str):
    """The mesh-first share of a ParallelMeshNHR that hccl-sim runs as HCCL does (AllReduce,
    AllGather, ReduceScatter), or None (the others' Parallel runs its levels in turn)."""
    split = _PARALLEL_SPLITS.get(ctx.name) if hccl_name.endswith("ParallelMeshNHR") else None
    return None if split is None else split(ctx, shape)


def _split_ratio(ctx, shape) -> float:
    """An AllReduce's or ReduceScatter's Parallel share mesh first (both executors take the
    ReduceScatter form): HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO where set
    (SetMultipleDimensionSplitRatio, op_common.cc: then the formula is not used), else HCCL's formula."""
    given = ctx.config.split_ratio
    return parallel_split(shape) if given is None else given


def _levels(hccl_name: str, shape: Shape, notes=(), split=None):
    """The levels in order: the server's mesh, NHR among a SuperPoD's servers, NHR among SuperPoDs
    (each where it has more than one member); with `split`, HCCL's Parallel executor (the rest of
    the data across servers first, at the same time)."""
    from . import Choice
    N2, N1, N0 = shape.pods
    across = "NHR"
    coll = colls.of(shape.name)
    # Reduce's Parallel executor runs a whole AllReduce (a rooted reduction's levels are AllReduce's)
    runs_as = "allreduce" if split is not None and coll.rooted and coll.reducing else shape.name
    if not registry.supports("NHR", runs_as, "level1"):     # NHR's Reduce is not built here
        across, notes = "ring", list(notes) + [f"hccl-sim's NHR builds no {shape.name}: ring across servers"]
    if split is not None:
        notes = list(notes) + [f"{split:g} of the data mesh first, the rest across servers first, at once"]
    detour = _detour(shape.clos, hccl_name, N0)
    if detour is not None:
        notes = list(notes) + [_detour_note(detour)]
    note = _note(hccl_name.replace("Parallel", "") if split is not None else hccl_name, notes)
    return Choice(False, "fullmesh" if N0 > 1 else None, across if N1 > 1 else None, note,
                  across if N2 > 1 else None, executor=hccl_name, split=split, detour=detour)


def _note(hccl_name: str, notes) -> str | None:
    said = [text for key, text in UNLIKE.items() if key in hccl_name.replace("AicpuReduce", "")]
    return "; ".join(list(notes) + said) or None


def choose(ctx):
    """HCCL's AICPU_TS choice for this call on a 950."""
    s = Shape(ctx)
    if not colls.of(ctx.name).carries_data:        # the barrier
        from . import Choice
        return Choice(True, None, "dissemination")
    if s.n == 1:
        return _flat(ctx, "fullmesh", _name(ctx, "Sole", "Mesh"), ["one rank: a local copy"])
    if not s.equal and op_of(ctx) not in FLAT_ALWAYS + V_FLAT:
        # servers of unequal size: HCCL's Level1Nhr (gcd of the level0 sizes 1) runs one NHR over
        # every rank; hccl-sim runs it for any unequal servers
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"), ["servers of unequal size: one NHR over every rank"])
    return _RULES[op_of(ctx)](ctx, s)


def _allreduce(ctx, s):
    if s.L == 1:          # SelectMeshAlgoAicpu, in its order
        if s.special:
            return _flat(ctx, "mesh_oneshot", _name(ctx, "Sole", "MeshOneShot")) if s.d <= 8 * MiB else \
                _flat(ctx, "fullmesh", _name(ctx, "Sole", "MeshTwoShot"))
        if s.two_level_net and s.n == 2 and s.d >= 8 * MiB:
            return _flat(ctx, "fullmesh", _name(ctx, "Sole", "MeshConcur"))
        if s.d <= 8 * MiB:
            return _flat(ctx, "mesh_oneshot", _name(ctx, "Sole", "MeshOneShot"))
        if s.d * 8 / s.n ** 2 > 32 * MiB:
            if s.two_level_net and s.d > 4 * GiB:
                return _flat(ctx, "fullmesh", _name(ctx, "Sole", "MeshConcur"))
            return _flat(ctx, mesh_chunk.NAME, _name(ctx, "Sole", "MeshChunkTwoShot"))
        return _flat(ctx, "fullmesh", _name(ctx, "Sole", "MeshTwoShot"))
    if s.special:
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHRAicpuReduce"))
    if s.L == 3 and s.uboe:
        return _across_uboe(ctx, s, "InsAllReduceParallelRSAGUboe")
    if s.per_server == 1:
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"))
    if s.L == 3:
        return _levels(_name(ctx, "Sequence", "MeshConcurNHRNHR"), s)
    if s.d > 32 * MiB:
        if s.d > 4 * GiB:
            return _levels(_name(ctx, "Sequence", "MeshConcurNHR"), s)
        return _levels(_name(ctx, "Parallel", "MeshNHR"), s, split=_split_ratio(ctx, s))
    return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"))


def _across_uboe(ctx, s, otherwise: str):
    """Three levels with UBoE between SuperPoDs: OmniPipe for 8-NPU servers, one NHR over every
    rank for one server per SuperPoD, else `otherwise` (HCCL's Parallel over two squeezed levels)."""
    if s.per_server == 8:
        return pipeline(ctx, s)
    if s.servers == s.superpods:
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"))
    return _squeezed(ctx, s, otherwise)


def pipeline(ctx, s):
    """HCCL's PipeLine (OmniPipe): AllGather, ReduceScatter and AllReduce as HCCL slices them
    (algorithms.omnipipe)."""
    choice = _levels(_name(ctx, "PipeLine", ""), s)._replace(note=None, pipelined=True)
    return choice._replace(level2=omnipipe.OPS[ctx.name].level2) if choice.level2 else choice


class _Squeezed:
    """A shape as HCCL's TopoMatchSqueeze2D sees it: level0 a SuperPoD's ranks, level1 the
    SuperPoDs; one channel per peer on either (an assumption: HCCL counts the channels of its
    links, which no 950 rank table published shows)."""

    def __init__(self, s):
        N2, N1, N0 = s.pods
        self.pods, self.clos_ports = (1, N2, N1 * N0), 1


# The UBoE Parallel executors: what runs on the squeezed levels (level0 template, level1 NHR) and
# how each splits (ins_v2_all_reduce_parallel_executor.cc, ins_v2_all_gather_parallel_executor.cc,
# ins_reduce_scatter_parallel_executor.cc, ins_v2_broadcast_parallel_executor.cc,
# reduce_parallel_executor.cc; §6.13)
_SQUEEZED = {"allreduce": "fullmesh", "allgather": "NHR", "reducescatter": "fullmesh", "broadcast": "NHR",
             "reduce": "NHR"}


def _squeezed(ctx, s, hccl_name: str):
    from . import Choice
    split = _PARALLEL_SPLITS[ctx.name](ctx, _Squeezed(s))
    notes = [f"{split:g} of the data inside each SuperPoD first, the rest across SuperPoDs first, at once"]
    return Choice(False, _SQUEEZED[ctx.name], "NHR", _note(hccl_name.replace("Parallel", ""), notes),
                  executor=hccl_name, split=split, squeezed=True)


def _gather_like(small: int, large_ranks: int):
    """AllGather's and ReduceScatter's rules across servers (they differ in two thresholds)."""
    def across(ctx, s):
        if colls.of(ctx.name).reducing and s.special:
            return _flat(ctx, "NHR", _name(ctx, "Sole", "NHRAicpuReduce"))
        if s.L == 3 and s.uboe:
            return _across_uboe(ctx, s, "InsReduceScatterParallelNHRNHRUboe" if colls.of(ctx.name).reducing
                                else _name(ctx, "Parallel", "NHRNHR"))
        if s.per_server == 1:
            return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"))
        if s.L >= 3:
            return _levels(_name(ctx, "Sequence", "MeshConcurNHRNHR"), s)
        if s.d * s.n >= GiB and s.n >= large_ranks:
            return _levels(_name(ctx, "Parallel", "MeshNHR"), s, split=_PARALLEL_SPLITS[ctx.name](ctx, s))
        if s.d > small:
            if s.d * s.n > 4 * GiB:
                return _levels(_name(ctx, "Sequence", "MeshConcurNHR"), s)
            return _levels(_name(ctx, "Parallel", "MeshNHR"), s, split=_PARALLEL_SPLITS[ctx.name](ctx, s))
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"))
    return across


_allgather_across = _gather_like(1 * MiB, 1024)
_reducescatter_across = _gather_like(4 * MiB, 256)


def _allgather(ctx, s):
    if s.L > 1:
        return _allgather_across(ctx, s)
    if s.two_level_net and (s.d * s.n > GiB or (s.n == 2 and s.d >= 4 * MiB)):
        return _flat(ctx, "fullmesh", _name(ctx, "Sole", "MeshConcur"))
    return _flat(ctx, "fullmesh", _name(ctx, "Sole", "Mesh"))


def _reducescatter(ctx, s):
    if s.L > 1:
        return _reducescatter_across(ctx, s)
    if s.special:
        return _flat(ctx, "fullmesh", _name(ctx, "Sole", "Mesh"))
    ratio = (8 / s.n) ** 2
    if s.two_level_net and s.n == 2 and s.d >= 4 * MiB:
        return _flat(ctx, "fullmesh", _name(ctx, "Sole", "MeshConcur"))
    if (s.two_level_net and s.d * s.n > 1.5 * GiB) or s.d * ratio > 16 * MiB:
        return _flat(ctx, mesh_chunk.NAME, _name(ctx, "Sole", "MeshChunk"))
    return _flat(ctx, "fullmesh", _name(ctx, "Sole", "Mesh"))


def _alltoall(ctx, s):
    # every AlltoAll (and its V forms) is HCCL's flat mesh template, whatever the levels, 16 peers
    # at a time (algorithms.mesh_rounds); more than 150 MiB over all peers drops the single
    # channel (alltoall_auto_selector.cc); the V forms (which select as AlltoAll, with their
    # counts) take their own names, AicpuAllToAllVSoleMesh and AicpuAllToAllVCSoleMesh
    # (alltoallv_ / alltoallvc_auto_selector.cc)
    from . import Choice
    if colls.of(op_of(ctx)).variable:
        hccl_name = _name(ctx, "Sole", "Mesh")
    else:
        hccl_name = _name(ctx, "Sole", "Mesh") if s.d * s.n > 150 * MiB else _name(ctx, "Sole", "MeshSingleChannel")
    return Choice(True, None, "mesh_rounds", _note(hccl_name, ()), executor=hccl_name)


def _broadcast(ctx, s):
    if s.L == 1:
        return _flat(ctx, "fullmesh", _name(ctx, "Sole", "MeshTwoShot"))
    if s.per_server == 1 or (s.L == 3 and s.servers == s.superpods):
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"))
    if s.L == 3:
        if s.uboe:
            return _squeezed(ctx, s, "InsBroadcastParallelNHRNHRUboe")
        return _levels(_name(ctx, "Sequence", "Mesh1dNHRNHR"), s)
    return _levels(_name(ctx, "Parallel", "MeshNHR"), s, split=_PARALLEL_SPLITS[ctx.name](ctx, s))


def _reduce(ctx, s):
    if s.L == 1:
        if s.d >= 8 * MiB:
            return _flat(ctx, "fullmesh", _name(ctx, "Sole", "MeshTwoShot"))
        return _flat(ctx, "mesh_oneshot", _name(ctx, "Sole", "Mesh"), ["every rank writes its input to the root"])
    if s.special:
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHRAicpuReduce"))
    if s.per_server == 1:
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"))
    if s.L == 3:
        if s.uboe:
            return _squeezed(ctx, s, "ReduceParallelNHRNHRUboe")
        return _levels(_name(ctx, "Sequence", "Mesh1DNHRNHR"), s)
    return _levels(_name(ctx, "Parallel", "MeshNHR"), s, split=_PARALLEL_SPLITS[ctx.name](ctx, s))


def _scatter(ctx, s):
    if s.L == 1:
        return _flat(ctx, "fullmesh", _name(ctx, "Sole", "Mesh"))
    if s.per_server == 1 or s.L == 3:
        return _flat(ctx, "NHR", _name(ctx, "Sole", "NHR"))
    return _levels(_name(ctx, "Parallel", "MeshNHR"), s, split=_PARALLEL_SPLITS[ctx.name](ctx, s))


def _gather_v(ctx, s):
    # AllGatherV / ReduceScatterV: one mesh over every rank at any level count (TopoMatch1D;
    # all_gather_v_ / reduce_scatter_v_auto_selector.cc SelectAicpuAlgo); a ReduceScatterV of
    # uint64 or fp64 matches nothing there
    if colls.of(op_of(ctx)).reducing and ctx.signature.dtype in ("uint64", "float64"):
        from topologies.errors import HcclError
        raise HcclError("E_NOT_SUPPORT", f"ReduceScatterV of {ctx.signature.dtype} on {ctx.topo.name}: HCCL's "
                        "AI CPU selector for it takes no UINT64 or FP64 (reduce_scatter_v_auto_selector.cc)")
    return _flat(ctx, "fullmesh", _name(ctx, "Sole", "Mesh"))


_PARALLEL_SPLITS = {"allreduce": _split_ratio, "allgather": _allgather_split, "reducescatter": _split_ratio,
                    "broadcast": _broadcast_split, "reduce": _split_ratio, "scatter": _half}
"""The ops whose ParallelMeshNHR hccl-sim runs as HCCL does, and how each splits its data (Reduce
as AllReduce: its executor runs a parallel AllReduce)."""
_RULES = {"allreduce": _allreduce, "allgather": _allgather, "reducescatter": _reducescatter, "alltoall": _alltoall,
          "alltoallv": _alltoall, "alltoallvc": _alltoall, "broadcast": _broadcast, "reduce": _reduce,
          "scatter": _scatter, "allgatherv": _gather_v, "reducescatterv": _gather_v}
