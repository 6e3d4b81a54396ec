"""HCCL's own selection rules and its documented fallbacks (docs/references.md §6.1, §6.5, §6.6, §7.1).

Sources: hcomm coll_alg_operator.cc (SelectAlgoType*, the cost comparison), alg_configurator.cc
(level0 by hardware, GetDefaultAlgoLevel1V1, the pipeline conditions), device_capacity.cc, and
HCCL_ALGO.md / inter_server_algo_support.md for what an explicit choice falls back to.

Policy (`choose`): on 910B, pipeline first when its size thresholds hold, then the cost comparison
of ring, NHR and H-D_R with HCCL's 60 us latency and 20 GB/s RDMA bandwidth constants; the V1
default (H-D_R for >= 8 or a power of two of servers, else ring) for Broadcast/Reduce and for 910A.
Synthetic (flat) topologies: H-D_R for a power-of-two rank count, else ring (HCCL_ALGO.md's
documented default); AlltoAll is always pairwise.

Fallbacks (`resolve_explicit`), each named in the op's label:
- level1 `fullmesh`, and `pairwise` for anything but AlltoAll, are ignored and HCCL selects (docs/references.md §6.6);
- AlltoAll runs pairwise whatever level1 says; Broadcast and Reduce take H-D_R for a level1 they
  do not support (ring for Broadcast, NHR/NB/pipeline for Reduce) (inter_server_algo_support.md);
- pipeline runs only on 910B with equal servers of >= 2 cards and <= 65535 FFTS+ contexts, else
  H-D_R (docs/references.md §6.5).
Tokens HCCL accepts but this emulator does not build (NHR_V1, AHC, AHC_BROKE) are E_NOT_SUPPORT;
a registry algorithm that does not build the collective at that level is E_PARA.
"""
from __future__ import annotations

import math

from topologies.errors import HcclError
from topologies.model import is_power_of_two

from ..algorithms import registry

SELECT_LATENCY_US = 60.0            # HCCL model constant: coll_alg_operator.cc LATENCY
GB2B = 1 << 30
FFTS_CONTEXT_LIMIT = 65535          # HCCL: FFTS+ contexts of one task
PIPELINE_MIN_AG_RS = {True: 32 << 10, False: 2 << 20}       # RDMA-lite supported or not
PIPELINE_MIN_AR_SLICE = {True: 1 << 20, False: 2 << 20}
NOT_BUILT = ("NHR_V1", "AHC", "AHC_BROKE")


def level0_for(topo, srv) -> str:
    """HCCL's level0 from the hardware (alg_configurator.cc)."""
    if topo.device_model.server_layout == "groups":      # 910A: two HCCS groups joined by PCIe
        if srv.equal and srv.K == 8:
            return "ring"          # 8P ring over the two HCCS groups and the PCIe link between them
        if srv.K == 4:
            return "fullmesh"      # 4P mesh
        return "ring" if srv.equal else "fullmesh"
    return "fullmesh"              # 910B: NP_MESH (HCCS between every pair)


def pipeline_contexts(name: str, m: int, k: int) -> int:
    """HCCL's FFTS+ context count of a pipeline op (CalcContextNumForPipeline)."""
    per_step = 5 * (k - 1) + 8
    if name == "allreduce":
        return 2 * (m * per_step + 5)
    return m * per_step + 5


def pipeline_refusal(name, topo, srv):
    """None if HCCL would run pipeline for `name` here, else why not."""
    if name not in registry.get("pipeline").collectives:
        return f"pipeline does not run {name}"
    if not topo.device_model.pipeline:
        return f"pipeline runs on 910B only, not {topo.device}"
    if not srv.equal:
        return "pipeline needs servers with equal card counts"
    if srv.K < 2 or srv.m < 2:
        return "pipeline needs at least 2 servers of at least 2 cards"
    contexts = pipeline_contexts(name, srv.m, srv.K)
    if contexts > FFTS_CONTEXT_LIMIT:
        return f"pipeline needs {contexts} FFTS+ contexts, over HCCL's {FFTS_CONTEXT_LIMIT}"
    return None


def pipeline_eligible(name, topo, srv) -> bool:
    return pipeline_refusal(name, topo, srv) is None


def v1_default(m: int) -> str:
    """HCCL's GetDefaultAlgoLevel1V1."""
    if m >= 8 or (m > 1 and is_power_of_two(m)):
        return "H-D_R"
    return "ring"


def cost_choice(name: str, cur_size: int, topo, srv, config) -> str:
    """HCCL's cost comparison of ring, NHR and H-D_R (coll_alg_operator.cc SelectAlgoType*)."""
    m, n, N = srv.m, srv.K, srv.p
    ccl = config.buffsize_bytes if name == "allreduce" else config.buffsize_bytes // N
    S = min(cur_size, ccl)
    bw_gb = 64 * 0.85 if N == 2 * n else topo.params.get("select_bandwidth_gb", 20.0)
    B = bw_gb * GB2B
    d = SELECT_LATENCY_US
    X = S / n if name == "allreduce" else S * N
    T = (m - 1) / m * X / B * 1e6
    lg = math.ceil(math.log2(m))
    scale = 2 if name == "allreduce" else 1
    ring = scale * ((m - 1) * d + T)
    nhr = scale * (lg * d + T)
    if is_power_of_two(m):
        hd = scale * (int(math.log2(m)) * d + T)
    else:
        hd = scale * (lg * d + (2 * m - 1) / m * X / B * 1e6)
    alg = "NHR" if nhr < ring else "ring"
    if hd < min(nhr, ring):
        alg = "H-D_R"
    return alg


def _inline(topo, dtype, redop) -> bool:
    dm = topo.device_model
    return dtype in dm.inline_reduce_dtypes and (redop or "sum") in dm.inline_reduce_ops


def choose(ctx, flat: bool, level0) -> str:
    """HCCL's adaptive choice: the flat algorithm, or level1 of the hierarchy."""
    name, sig, topo, srv, config = ctx.name, ctx.signature, ctx.topo, ctx.servers, ctx.config
    if name == "alltoall":
        return "pairwise"
    if flat:
        p = topo.num_ranks
        if name in ("allreduce", "allgather", "reducescatter") and is_power_of_two(p) and p > 1:
            return "H-D_R"
        return "ring"
    if not topo.device_model.level1_cost_model or name in ("broadcast", "reduce"):
        return "H-D_R" if name == "broadcast" else v1_default(srv.m)
    per_rank = math.prod(sig.shape) * ctx.itemsize   # AllReduce: the buffer; AllGather: send bytes
    if name == "reducescatter":
        per_rank //= srv.p                            # ReduceScatter: receive bytes
    rdma_lite = bool(topo.params.get("rdma_lite", True))
    nondet = _inline(topo, sig.dtype, sig.redop) and config.deterministic == "false"
    if pipeline_eligible(name, topo, srv):
        if name == "allgather" and per_rank >= PIPELINE_MIN_AG_RS[rdma_lite]:
            return "pipeline"
        if name == "reducescatter" and nondet and per_rank >= PIPELINE_MIN_AG_RS[rdma_lite]:
            return "pipeline"
        if name == "allreduce" and nondet and per_rank // (srv.m * srv.K) >= PIPELINE_MIN_AR_SLICE[rdma_lite]:
            return "pipeline"
    return cost_choice(name, per_rank, topo, srv, config)


def _supported_text(name, level, ctx) -> str:
    names = registry.supporting(name, level)
    if level == "level1" and not pipeline_eligible(name, ctx.topo, ctx.servers):
        names = [n for n in names if n != "pipeline"]
    where = "synthetic topologies" if level == "flat" else f"level1 of {ctx.topo.name}"
    return f"{name} on {where} supports {', '.join(names)}"


def resolve_explicit(name: str, token: str, ctx, level: str):
    """(algorithm, note) for an explicit choice at `level` ("flat" or "level1"): the algorithm
    HCCL runs (None: HCCL ignores the choice and selects), and why it is not the token, if not."""
    if token in NOT_BUILT:
        raise HcclError("E_NOT_SUPPORT", f"algorithm {token} is accepted by HCCL but not built by hccl-sim; "
                        + _supported_text(name, level, ctx))
    if token == "pipeline" and level == "level1":
        why = pipeline_refusal(name, ctx.topo, ctx.servers)
        if why is None:
            return "pipeline", None
        if name == "alltoall":
            return "pairwise", "pipeline unsupported for alltoall: HCCL runs pairwise"
        return "H-D_R", f"{why}: HCCL falls back to H-D_R"
    if registry.supports(token, name, level):
        return token, None
    if token == "pipeline":
        return ("pairwise" if name == "alltoall" else "H-D_R",
                "pipeline needs 910B servers: HCCL falls back to " + ("pairwise" if name == "alltoall" else "H-D_R"))
    if token == "fullmesh" and level == "level1":
        return None, "fullmesh is not a level1 algorithm: HCCL ignores it and selects"
    if name == "alltoall" and token in registry.ALGORITHMS:
        return "pairwise", f"{token} unsupported for alltoall: HCCL runs pairwise"
    if token == "pairwise":
        return None, f"pairwise applies to alltoall only: HCCL ignores it for {name} and selects"
    if name in ("broadcast", "reduce") and token in ("ring", "NHR", "NB", "H-D_R"):
        return "H-D_R", f"{token} unsupported for {name}: HCCL falls back to H-D_R"
    raise HcclError("E_PARA", f"algorithm {token!r} does not run {name} here; " + _supported_text(name, level, ctx))
