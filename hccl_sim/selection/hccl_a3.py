"""HCCL's selection on an Atlas 900 A3 SuperPoD (DEV_TYPE_910_93), from hcomm src/legacy/ascend910
(reference notes on A3): alg_configurator.cc (GetDefaultAlgoLevel0Module, SetAlgoLevel1 with
GetDefaultAlgoLevel1V1, SetAlgoLevel2), the A3 selectors (*_operator.cc SelectAlgfor91093) and
the level switches of the *_for_910_93 executors.

- level0: the double ring when every die's SIO partner is in the communicator
  (IsHCCSSWNumEqualToTwiceSIONum), else a single ring.
- level1 default: NHR when the communicator spans >= 8 servers or a power of two of them, else
  ring (HD replaced by NHR; A3 has no cost-model choice). Explicit: ring, NHR, NB run; H-D_R
  becomes NHR; Broadcast runs NHR for anything but NHR and NB (NB's Broadcast is not built here:
  refused);
  Reduce always runs ring; pipeline is refused for AllReduce (its A3 executor has no such case),
  NHR for the others; fullmesh and pairwise are ignored.
- level2 default: NHR (the code; HCCL_ALGO.md says ring for < 8 superpods that are not a power
  of two, else H-D_R: the code wins). Parsed as SetAlgoLevel2 does: H-D_R, ring, NHR, NB,
  pipeline kept, any other token NHR; then each executor's switch: AllReduce NB/NHR/ring else
  H-D_R; AllGather and ReduceScatter NB/NHR else ring; Broadcast NB/NHR else H-D_R; Reduce ring
  else H-D_R.
- AlltoAll: the grouped full mesh, whatever HCCL_ALGO says.
- Small AllReduce: AllReduceComm, one flat NHR over every rank, for <= 1 MiB x dies per server
  on one superpod (<= 16 KiB x dies per server across superpods or with HCCS disabled between
  servers), when no algorithm was asked for. HCCL's other small- and mid-count executors (AIV,
  mesh small-count, MidCount, the A3 pipelines) are not modelled.
- HCCL_OP_EXPANSION_MODE=AIV on one server, no algorithm asked for: AllGather up to 512 KiB per
  rank, ReduceScatter up to 1 MiB per rank and AllReduce up to 1 MiB per die (sum, max, min) run
  as one AIV mesh kernel (hccl_aiv.h's A3 entry sizes; the AllGather/ReduceScatter/AllReduce
  SelectAlgfor91093 AIV branches): the full mesh over the server's dies, priced with the preset's
  AIV call costs and no per-step dispatch (topologies.presets.with_kernel). HCCL's other AIV
  kernels (Broadcast, AlltoAll, graph mode's larger entries) are not modelled.
- Without AIV, on one server, no algorithm asked for: AllGather up to 512 KiB per rank
  (AllGatherSmallCount, SmallCountOptimSinglePod) and AllReduce up to 512 KiB x the server's dies
  (AllReduceMeshSmallCount) run the full mesh, expanded on the AI CPU as the double ring is
  (its per-step dispatch and call costs). ReduceScatter's small-count executor (ReduceScatterDeter)
  is not modelled: it runs the double ring.
- Servers of unequal die counts (HCCL's ARS executors) are not modelled: they run flat, named.
Every replacement is named in the label (`last_op.algo`).
"""
from __future__ import annotations

import math

import numpy as np

from topologies.errors import HcclError
from topologies.model import is_power_of_two

from ..algorithms import registry
from .hccl import NOT_BUILT

LEVEL2_KEPT = ("H-D_R", "ring", "NHR", "NB", "pipeline")
LEVEL2_RUNS = {"allreduce": (("NB", "NHR", "ring"), "H-D_R"), "allgather": (("NB", "NHR"), "ring"),
               "reducescatter": (("NB", "NHR"), "ring"), "broadcast": (("NB", "NHR"), "H-D_R"),
               "reduce": (("ring",), "H-D_R")}
SMALL_ONE_POD = 1 << 20            # bytes per die of the server (HCCL_SMALL_COUNT_1_MB x N0)
SMALL_MULTI_POD = 16 << 10         # HCCL_SMALL_COUNT_16_KB x N0 ("A3打平ROCE")
AIV_ENTRY = {"allgather": 512 << 10,      # AIV_ALL_GATHER_A3_ENTRY_SIZE: per-rank input bytes
             "reducescatter": 1 << 20,    # AIV_REDUCE_SCATTER_A3_ENTRY_SIZE: per-rank output bytes
             "allreduce": 1 << 20}        # AIV_ALL_REDUCE_A3_ENTRY_SIZE: the buffer's bytes per die
AIV_REDOPS = ("sum", "max", "min")
SMALL_COUNT = {"allgather": 512 << 10,    # AllGatherSmallCount: per-rank input bytes
               "allreduce": 512 << 10}    # AllReduceMeshSmallCount: the buffer's bytes per die of the server


def _choice(level0, level1, level2, notes, flat=False):
    from . import Choice
    note = "; ".join(n for n in notes if n) or None
    return Choice(flat, level0, level1, note, level2)


def level0_for(topo, srv) -> str:
    """double_ring when every die of every server has its SIO partner (dies 2k, 2k+1) with it."""
    dev = np.asarray(topo.device_of, dtype=np.int64)
    for ranks in srv.ranks:
        have = set(dev[ranks].tolist())
        if any((d ^ 1) not in have for d in have):
            return "ring"
    return "double_ring"


def level1_default(m: int) -> str:
    return "NHR" if m >= 8 or (m > 1 and is_power_of_two(m)) else "ring"


def _level1(name, token, m):
    """(algorithm, note) at level1."""
    if token in NOT_BUILT:
        raise HcclError("E_NOT_SUPPORT", f"algorithm {token} is accepted by HCCL but not built by hccl-sim; A3 level1 "
                        "runs ring, NHR or NB")
    if token in ("fullmesh", "pairwise"):
        note, token = f"{token} is not an A3 level1 algorithm: HCCL ignores it and selects", None
    else:
        note = None
    if name == "reduce":
        return "ring", (note or (None if token in (None, "ring") else f"A3 Reduce runs ring at level1, not {token}"))
    if token is None:
        algo = level1_default(m)
        if name == "broadcast" and algo != "NHR":
            return "NHR", note
        return algo, note
    if token == "pipeline" and name == "allreduce":
        raise HcclError("E_NOT_SUPPORT", "level1 pipeline is not run by HCCL's A3 AllReduce executor (its level1 "
                        "switch has ring, NHR, NB); use ring, NHR or NB")
    if token in ("H-D_R", "pipeline"):
        return "NHR", f"A3 runs NHR at level1 instead of {token}"
    if name == "broadcast" and token == "NB":
        raise HcclError("E_NOT_SUPPORT", "NB Broadcast is run by HCCL at A3 level1 but not built by hccl-sim; use NHR")
    if name == "broadcast" and token != "NHR":
        return "NHR", f"A3 Broadcast runs NHR at level1 instead of {token}"
    if not registry.supports(token, name, "level1"):     # a level0 or executor algorithm's name (double_ring, ...)
        raise HcclError("E_PARA", f"algorithm {token!r} does not run {name} at A3 level1; it runs "
                        f"{', '.join(a for a in ('ring', 'NHR', 'NB') if registry.supports(a, name, 'level1'))}")
    return token, None


def _level2(name, token):
    """(algorithm, note) at level2."""
    notes = []
    parsed = token if token in LEVEL2_KEPT else "NHR"
    if token is not None and parsed != token and token not in ("NA", "null"):
        notes.append(f"level2 {token} is read as NHR by HCCL")
    kept, otherwise = LEVEL2_RUNS[name]
    algo = parsed if parsed in kept else otherwise
    if algo != parsed and token is not None:
        notes.append(f"A3 {name} runs {algo} at level2 for {parsed}")
    if not registry.supports(algo, name, "level1"):
        raise HcclError("E_NOT_SUPPORT", f"{algo} {name} is run by HCCL at A3 level2 but not built by hccl-sim; "
                        f"level2 {name} here supports {', '.join(registry.supporting(name, 'level1'))}")
    return algo, "; ".join(notes) or None


def _small_allreduce(ctx) -> bool:
    srv, pods = ctx.servers, ctx.pods
    per_rank = math.prod(ctx.signature.shape) * ctx.itemsize
    one_pod = pods.physical == 1 and ctx.topo.params.get("inter_hccs", True)
    return srv.m > 1 and per_rank <= (SMALL_ONE_POD if one_pod else SMALL_MULTI_POD) * srv.K


def _per_rank_bytes(ctx) -> float:
    """The size HCCL's A3 entry limits compare: AllGather's per-rank input, ReduceScatter's
    per-rank output, AllReduce's buffer per die."""
    nbytes = math.prod(ctx.signature.shape) * ctx.itemsize
    return nbytes if ctx.name == "allgather" else nbytes / ctx.topo.num_ranks


def _aiv(ctx, token, token2) -> bool:
    """Whether HCCL runs this call as one AIV kernel (see the module docstring)."""
    limit = AIV_ENTRY.get(ctx.name)
    if ctx.config.expansion != "AIV" or limit is None or token is not None or token2 is not None:
        return False
    if ctx.pods.shape[0] > 1 or ctx.pods.shape[1] > 1 or not ctx.topo.device_model.aiv_op_overhead_ns:
        return False
    if ctx.signature.redop is not None and ctx.signature.redop not in AIV_REDOPS:
        return False
    return _per_rank_bytes(ctx) <= limit


def _small_count(ctx, token, token2) -> bool:
    """Whether HCCL runs this call, expanded on the AI CPU, as its small-count mesh (see the
    module docstring)."""
    limit = SMALL_COUNT.get(ctx.name)
    if ctx.config.expansion == "AIV" or limit is None or token is not None or token2 is not None:
        return False
    if ctx.pods.shape[0] > 1 or ctx.pods.shape[1] > 1:
        return False
    total = math.prod(ctx.signature.shape) * ctx.itemsize * (ctx.topo.num_ranks if ctx.name == "allgather" else 1)
    return _per_rank_bytes(ctx) <= limit and total <= ctx.config.buffsize_bytes


def choose(ctx, token, token2):
    """HCCL's A3 choice for one call; `token`, `token2`: the level1 and level2 tokens asked for."""
    name, srv, pods = ctx.name, ctx.servers, ctx.pods
    if token in ("NA", "null"):
        token = None
    if _aiv(ctx, token, token2):
        from . import Choice
        return Choice(True, None, "fullmesh", None, None, "AIV")
    if _small_count(ctx, token, token2):
        return _choice(None, "fullmesh", None, [f"small count: HCCL's {'AllGatherSmallCount' if name == 'allgather' else 'AllReduceMeshSmallCount'}"], flat=True)
    if name == "alltoall":
        note = None if token is None and token2 is None else "A3 AlltoAll is the grouped full mesh whatever HCCL_ALGO says"
        if not pods.equal:
            return _choice(None, "pairwise", None, ["servers with unequal die counts: HCCL's ARS executors are not "
                                                    "modelled; hccl-sim runs pairwise over every rank"], flat=True)
        return _choice(None, "grouped_fullmesh", None, [note], flat=True)
    if not pods.equal or (not pods.canonical and name in ("allgather", "reducescatter")):
        algo = "NHR" if registry.supports("NHR", name) else "ring"
        why = ("servers with unequal die counts: HCCL's ARS executors are not modelled" if not pods.equal else
               "ranks not numbered superpod, server, die in order")
        return _choice(None, algo, None, [f"{why}; hccl-sim runs {algo} over every rank"], flat=True)
    if name == "allreduce" and token is None and token2 is None and _small_allreduce(ctx):
        return _choice(None, "NHR", None, ["small data: HCCL's AllReduceComm, one NHR over every rank"], flat=True)
    N2, N1, N0 = pods.shape
    level0 = level0_for(ctx.topo, srv) if N0 > 1 else None
    notes = []
    level1 = None
    if N1 > 1:
        level1, note = _level1(name, token, srv.m)
        notes.append(note)
    elif token is not None:
        notes.append(f"one server per superpod: no level1, {token} not used")
    level2 = None
    if N2 > 1:
        level2, note = _level2(name, token2)
        notes.append(note)
    elif token2 is not None:
        notes.append(f"one superpod: no level2, {token2} not used")
    if pods.unequal:
        notes.append(f"unequal superpods: NHR-HCF, {N2} logical superpods of {N1} servers")
    return _choice(level0, level1, level2, notes)
