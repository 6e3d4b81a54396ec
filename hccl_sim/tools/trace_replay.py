"""`hccl-sim replay`: a training step's communication, recorded on a few ranks
(hccl_sim.torch.export_trace), priced again on a bigger cluster with its groups laid out by a mesh.

The trace lists one rank's collectives in issue order: each op's name, size (as nccl-tests counts
it: the AllReduce buffer, the whole AllGather output, the whole ReduceScatter input, the whole
AlltoAll send buffer: the op's global bytes, whatever the group's size), dtype, and the mesh
dimension of its group ("world" for the default group), on one stream, each after the one before.
The replay lays the mesh out on the topology with the last dimension innermost (`--mesh
dp=512,tp=8`: tp the 8 cards of a server, dp one card per server), takes rank 0's group along each
dimension, and prices every op on that group's real places (topologies.subset), with the same
global bytes, so each rank's share is recomputed for the new group size by the op's own rule.
Variable-size ops are priced as their fixed-size forms of the same size (equal blocks); sends and
receives are not replayed (the mesh has no peer for them), and are counted apart.
"""
from __future__ import annotations

import json
import time
from collections import OrderedDict

import numpy as np

from topologies.errors import HcclError
from topologies.subset import subset

from ..comm.record import TRACE_FORMAT

FORMAT = TRACE_FORMAT
_FIXED = {"alltoallv": "alltoall", "alltoallvc": "alltoall", "allgatherv": "allgather", "reducescatterv": "reducescatter"}
_P2P = ("send", "recv", "isend", "irecv", "batch_send_recv")


def load(path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise HcclError("E_PARA", f"replay: cannot read the trace {path}: {exc}") from None
    if not isinstance(trace, dict) or trace.get("format") != FORMAT or not isinstance(trace.get("ops"), list):
        raise HcclError("E_PARA", f"replay: {path} is not a trace of hccl_sim.torch.export_trace ({FORMAT!r})")
    return trace


def parse_mesh(text: str) -> "OrderedDict[str, int]":
    mesh = OrderedDict()
    for part in (text or "").split(","):
        name, sep, size = part.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise HcclError("E_PARA", f"--mesh {text!r}: expected NAME=SIZE,... (e.g. dp=512,tp=8)")
        if name.strip() in mesh or name.strip() == "world":
            raise HcclError("E_PARA", f"--mesh {text!r}: dimension {name.strip()!r} named twice or reserved")
        mesh[name.strip()] = int(size)
    return mesh


def groups_of_rank0(mesh, num_ranks: int) -> dict:
    """Rank 0's group along every mesh dimension (and "world"), the last dimension innermost."""
    sizes = list(mesh.values())
    if int(np.prod(sizes)) != num_ranks:
        raise HcclError("E_PARA", f"--mesh {','.join(f'{k}={v}' for k, v in mesh.items())}: {int(np.prod(sizes))} "
                        f"ranks, the topology has {num_ranks}")
    strides = np.cumprod([1] + sizes[::-1][:-1])[::-1]
    groups = {dim: [int(k * stride) for k in range(size)] for (dim, size), stride in zip(mesh.items(), strides)}
    groups["world"] = list(range(num_ranks))
    return groups


def replay(trace: dict, topo, mesh) -> dict:
    """Every op priced on its group: per dimension (ops, simulated s), the p2p ops skipped, the
    algorithms seen, and the wall time the replay took."""
    import hccl_sim
    groups = groups_of_rank0(mesh, topo.num_ranks)
    started = time.perf_counter()
    priced, per_dim, skipped, algos, subs = {}, OrderedDict(), 0, {}, {}
    for k, op in enumerate(trace["ops"]):
        name, dim = op.get("op"), op.get("dim")
        if name in _P2P:
            skipped += 1
            continue
        if dim not in groups:
            raise HcclError("E_PARA", f"replay: op {k} ({name}) runs on mesh dimension {dim!r}, which --mesh does not "
                            f"name (it has {', '.join(mesh)})")
        key = (_FIXED.get(name, name), int(op["nbytes"]), op.get("dtype", "float32"), dim)
        if key not in priced:
            if dim not in subs:
                subs[dim] = topo if dim == "world" else subset(topo, groups[dim])
            est = hccl_sim.simulate(key[0], key[1], topology=subs[dim], dtype=key[2])
            priced[key] = (est.time, est.algo)
        t, algo = priced[key]
        count, total = per_dim.get(dim, (0, 0.0))
        per_dim[dim] = (count + 1, total + t)
        algos.setdefault(dim, set()).add(f"{key[0]} {algo}")
    return {"per_dim": per_dim, "skipped_p2p": skipped, "algos": algos, "wall_s": time.perf_counter() - started,
            "group_sizes": {dim: len(members) for dim, members in groups.items()}}


def report(result, trace, topo) -> str:
    lines = [f"# replay of {len(trace['ops'])} ops (recorded on {trace.get('ranks')} ranks: "
             f"{', '.join(f'{k}={v}' for k, v in trace.get('groups', {}).items())}) on {topo.name} "
             f"({topo.num_servers} server{'s' if topo.num_servers != 1 else ''}, {topo.num_ranks} ranks)",
             f"# {'dimension':>9} {'group':>6} {'ops':>5} {'simulated comm':>15}  algorithms"]
    total = 0.0
    for dim, (count, t) in result["per_dim"].items():
        total += t
        lines.append(f"  {dim:>9} {result['group_sizes'][dim]:>6} {count:>5} {t * 1e6:>12.1f} us  "
                     f"{'; '.join(sorted(result['algos'][dim]))}")
    lines.append(f"# the step's communication, one stream: {total * 1e6:.1f} us; sends/receives not replayed: "
                 f"{result['skipped_p2p']}; replay wall {result['wall_s']:.2f} s")
    return "\n".join(lines)
