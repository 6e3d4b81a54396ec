"""HCCL_BIRS_ENABLE=TRUE: when HcclReduceScatter runs the BIRS executor (algorithms.birs), and what
it refuses (docs/references.md §6.12).

From hicann/hccl 09300b70, assuming a build with ENABLE_EXPERIMENTAL=ON (the user who sets the
variable asks for it) and an hcomm of CANN 9.0.0 or later: `HcclReduceScatter` on any device but
the 950/960 calls `ReduceScatterExperimental`, which with the variable exactly "TRUE" (MatchBIRS)
returns success for a zero count and otherwise runs `ExecOpBirs`: `SelectAlgReduceScatter` (level1
reset to ring unless NHR, NB or ring, which the executor never reads: it runs on the level-0
communicator over every rank) and `DecideReduceScatterBirsAlg`, in this order:
- one rank: kRejectRankSizeOne, HCCL_E_INTERNAL;
- a device other than DEV_TYPE_910_93 (A3), or an odd rank count: kNotSelected, which leaves the
  executor name empty, and `ExecOpBirs` then finds no executor: HCCL_E_PARA "[ExecOpBirs]Fail to
  find executor for algName[]". The normal ReduceScatter does not run;
- userRankSize / serverNum < 4: HCCL_E_PARA "ReduceScatterBIRS not supported: userRankSize[%u] /
  serverNum[%u] < 4" (serverNum 0, refused before, cannot happen here);
- else "ReduceScatterBIRSExecutor". On several servers its template takes p / S dies per server:
  an odd count fails in RunAsync (HCCL_E_INTERNAL, "intraRankSize_[%u] is not evenly divisible by
  rankSizeX_[%u]"); a rank count S does not divide is not modelled (E_NOT_SUPPORT).
It comes before everything else HCCL decides for the call (AIV, small counts, HCCL_ALGO).
ReduceScatterV, AllReduce and the other collectives are unchanged.
"""
from __future__ import annotations

import math
from typing import Optional

from topologies.errors import HcclError

from ..algorithms import birs

MIN_DIES_PER_SERVER = 4          # DecideReduceScatterBirsAlg: userRankSize / serverNum < 4 is refused


def choose(ctx, token: Optional[str], token2: Optional[str]):
    """The BIRS executor's Choice for this call, None when HCCL does not take the BIRS path (the
    variable off, another collective, a zero count), or its refusal; `token`, `token2`: the
    level1 and level2 algorithms asked for, which it does not use (said in the label)."""
    from . import Choice
    sig = ctx.signature
    if not ctx.config.birs or sig.name != "reducescatter" or math.prod(sig.shape) == 0:
        return None
    p, servers = ctx.topo.num_ranks, ctx.servers.m
    where = f"HCCL_BIRS_ENABLE=TRUE, ReduceScatter on {p} rank{'s' if p > 1 else ''} of {ctx.topo.name}"
    if p == 1:
        raise HcclError("E_INTERNAL", f"{where}: ReduceScatterBIRS rejects userRankSize 1 "
                        "(DecideReduceScatterBirsAlg: kRejectRankSizeOne)")
    a3 = ctx.pods is not None and ctx.topo.device_model.server_layout == "die_pairs"   # A3: dies in packages
    if not a3 or p % 2:
        why = "an odd rank count" if a3 else f"a {ctx.topo.device} device, not A3 (DEV_TYPE_910_93)"
        raise HcclError("E_PARA", f"{where}: BIRS is not selected for {why} and HCCL's experimental path then has no "
                        "executor: [ExecOpBirs]Fail to find executor for algName[]")
    if p // servers < MIN_DIES_PER_SERVER:
        raise HcclError("E_PARA", f"{where}: ReduceScatterBIRS not supported: userRankSize[{p}] / "
                        f"serverNum[{servers}] < {MIN_DIES_PER_SERVER}")
    if servers > 1 and p % servers:
        raise HcclError("E_NOT_SUPPORT", f"{where}: {servers} servers do not divide {p} ranks; HCCL's "
                        "REDUCE_SCATTER_BIRS_INTER takes userRankSize / serverNum dies on every server "
                        "(not modelled otherwise)")
    if servers > 1 and (p // servers) % 2:
        raise HcclError("E_INTERNAL", f"{where}: [ReduceScatterBIRS][RunAsync]intraRankSize_[{p // servers}] is "
                        "not evenly divisible by rankSizeX_[2]")
    asked = [t for t in (token, token2) if t is not None]
    note = (f"HCCL_ALGO's {', '.join(asked)} not used: the BIRS executor runs its own schedule over every rank"
            if asked else None)
    return Choice(True, None, birs.NAME, note)
