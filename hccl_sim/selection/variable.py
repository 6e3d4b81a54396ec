"""What HCCL's executors of the V variants of AllGather and ReduceScatter run, from the choice made
for the collective they follow (all_gather_v_operator.cc, reduce_scatter_v_operator.cc, read at
libochao-huawei/hcomm@8958adbf; docs/references.md §6.9).

- Devices: AllGatherV and ReduceScatterV run on A3 and 910B (and 310P), not on 910A.
- 910B: level0 the mesh (AllGatherVMesh, ReduceScatterVMeshOpbase); level1 ring, NB, or
  pipeline (its V pipeline executors) as selected, anything else NHR ("使用nhr作为兜底算法").
  ReduceScatterV needs an inline reduction (else HCCL: "ReduceScatterV only support inlinereduce").
- A3: AllGatherVRingFor91093 / ReduceScatterVRingFor91093: a ring inside each server, level1
  ring, NB or NHR (NHR for any other token). Modelled with one ring where HCCL runs its aligned
  double ring, and with level1 over every server where HCCL adds a level2 among superpods.
  Servers of unequal die counts: HCCL's SelectAlgfor91093 refuses the op (E_NOT_SUPPORT, "not
  support mode, multiModuleDiffDeviceNumMode_[1]"). Superpods of unequal server counts run: with
  equal servers HCCL first cuts them into logical superpods of the gcd of their server counts
  (SetSuperPodInfo, hccl_communicator_attrs_host.cc), which clears multiSuperPodDiffServerNumMode_.
- Synthetic presets: the flat algorithm chosen for the collective (every one takes uneven blocks).
"""
from __future__ import annotations

from topologies.errors import HcclError

from .. import collectives as colls

V_LEVEL1 = ("ring", "NB", "NHR")
V_EXECUTORS = ("allgatherv", "reducescatterv")
"""The ops HCCL runs by its V executors' rules (all_gather_v_operator.cc, reduce_scatter_v_operator.cc)."""


def _join(*notes):
    return "; ".join(n for n in notes if n) or None


def check_device(ctx) -> None:
    """E_NOT_SUPPORT where HCCL does not run the op (910A; ReduceScatterV without inline reduction)."""
    sig, topo = ctx.signature, ctx.topo
    coll = colls.of(sig.name)
    if not topo.device_model.gather_v:
        raise HcclError("E_NOT_SUPPORT", f"{coll.method} does not run on {topo.device}: HCCL runs AllGatherV and "
                        "ReduceScatterV on A3 and 910B only")
    if coll.reducing and not ctx.flat and not topo.device_model.inline(sig.dtype, sig.redop or "sum"):
        raise HcclError("E_NOT_SUPPORT", f"{coll.method} of {sig.dtype} with op={sig.redop or 'sum'} does not run on "
                        f"{topo.device}: HCCL's ReduceScatterV only supports inline reduction")


def adjusted(ctx, choice):
    """The V executor's choice on 910B from the one its collective got."""
    if choice.flat or choice.level1 in V_LEVEL1 + (None, "pipeline"):
        return choice
    return choice._replace(level1="NHR", note=_join(choice.note, f"HCCL's V executor runs level1 {choice.level1} as "
                                                                  "NHR"))


def a3(ctx, token):
    """The A3 choice of a V op: a ring inside each server, level1 among the servers."""
    from . import Choice
    srv, pods = ctx.servers, ctx.pods
    if not srv.equal:       # all_gather_v_operator.cc / reduce_scatter_v_operator.cc, SelectAlgfor91093
        pod_of_server = ctx.topo.params["superpod_of_server"]
        pods_differ = int(len({pod_of_server.count(k) for k in set(pod_of_server)}) > 1)
        raise HcclError("E_NOT_SUPPORT", f"{colls.of(ctx.signature.name).method} on A3 servers of unequal die counts "
                        f"{sorted(set(srv.k.tolist()))}: HCCL's SelectAlgfor91093 refuses it (\"not support mode, "
                        f"multiModuleDiffDeviceNumMode_[1], multiSuperPodDiffServerNumMode_[{pods_differ}]\")")
    level0 = "ring" if srv.K > 1 else None
    level1, notes = None, []
    if srv.m > 1:
        level1 = token if token in V_LEVEL1 else "NHR"
        if token not in (None, level1):
            notes.append(f"HCCL's A3 V executor runs level1 {token} as NHR")
        if pods.shape[0] > 1:
            notes.append("level1 over every server (HCCL's level2 among superpods is not modelled for V ops)")
        if pods.unequal:
            notes.append(f"unequal superpods: HCCL's {pods.shape[0]} logical superpods of {pods.shape[1]} servers")
    elif token is not None:
        notes.append(f"one server: no level1, {token} not used")
    return Choice(False, level0, level1, _join(*notes))
