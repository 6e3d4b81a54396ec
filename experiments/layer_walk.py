"""Walk one AllReduce's execution on each engine: which modules its data movement visits, and how
often a call goes back up a layer (from hcomm into hccl_sim, or from any byte mover into the
collective layer: hccl_sim.collectives, .plan, .algorithms, .selection).

Every rank traces (sys.setprofile) only the group's `execute` of the measured op, after a warm-up
op of the same call, so what is counted is what every op of a training loop pays. Two sizes: an
8-byte op (the small-op path: eager on Ray and MPI) and a 1 MiB one (the shared-memory planes, or
the per-rank executor between nodes).

    python experiments/layer_walk.py                          # local; Ray on one node; Ray on two nodes
    mpiexec -n 4 python experiments/layer_walk.py --mpi       # MPI, every process on this node
"""
import argparse
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hccl_sim  # noqa: E402

COLLECTIVE_LAYER = ("hccl_sim.collectives", "hccl_sim.plan", "hccl_sim.algorithms", "hccl_sim.selection")


def _layer(module: str) -> str:
    return module.split(".")[0] if module else "?"


def walk(comm, count):
    """This rank's (modules visited, calls hcomm -> hccl_sim, calls into the collective layer)
    during the execute of one all_reduce of `count` float32 elements."""
    x = np.full(count, comm.rank + 1, dtype=np.float32)
    comm.all_reduce(x)                              # warm-up: plans, lowering, mappings made once
    group = comm._group
    execute = group.execute
    seen, up, collective = set(), [0], [0]

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        seen.add(callee)
        if _layer(caller) == "hcomm" and _layer(callee) == "hccl_sim":
            up[0] += 1
        if callee.startswith(COLLECTIVE_LAYER):
            collective[0] += 1

    def traced(*a, **kw):
        old = sys.getprofile()
        sys.setprofile(profile)
        threading.setprofile(profile)               # worker threads a plane starts for the op
        try:
            return execute(*a, **kw)
        finally:
            sys.setprofile(old)
            threading.setprofile(None)

    group.execute = traced
    try:
        y = comm.all_reduce(x)
    finally:
        group.execute = execute
    assert np.all(y == comm.size * (comm.size + 1) / 2)
    return (sorted(m for m in seen if m.startswith(("hccl_sim", "hcomm", "topologies"))), up[0], collective[0],
            comm.data_plane)


def report(engine, results):
    plane = results[0][3]
    modules = sorted({m for r in results if r is not None for m in r[0]})
    up = sum(r[1] for r in results if r is not None)
    coll = sum(r[2] for r in results if r is not None)
    print(f"{engine:<22} {plane:<8} calls hcomm->hccl_sim {up:>3}   calls into the collective layer {coll:>3}")
    print(f"    modules: {', '.join(modules)}")


def run_mpi():
    from hccl_sim.engines.mpi import world
    me = world().Get_rank()
    topo = hccl_sim.topology("fullmesh", ranks=world().Get_size())
    for count in (2, 1 << 18):
        results = hccl_sim.run(walk, topology=topo, engine="mpi", args=(count,))
        if me == 0:
            report(f"mpi {count * 4} B", results)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpi", action="store_true", help="run under mpiexec: the MPI engine")
    args = ap.parse_args()
    if args.mpi:
        run_mpi()
        return
    topo = hccl_sim.topology("fullmesh", ranks=4)
    for count in (2, 1 << 18):
        for plane in ("central", "threads"):
            report(f"local {count * 4} B", hccl_sim.run(walk, topology=topo, args=(count,), data_plane=plane))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster
    with hccl_sim.Cluster(topo, engine="ray") as cluster:          # one node: a local Ray of its own
        for count in (2, 1 << 18):
            report(f"ray 1 node {count * 4} B", cluster.run(walk, args=(count,)))
    nodes = Cluster()
    try:
        for k in range(2):
            nodes.add_node(num_cpus=1, object_store_memory=256 << 20, include_dashboard=False)
        here = os.path.dirname(os.path.abspath(__file__))
        ray.init(address=nodes.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": here}})
        import topologies
        two = topologies.hardware("atlas800t-a2", devices_per_server=[2, 2])   # a server per Ray node
        with hccl_sim.Cluster(two, engine="ray") as cluster:
            for count in (2, 1 << 18):
                report(f"ray 2 nodes {count * 4} B", cluster.run(walk, args=(count,)))
    finally:
        ray.shutdown()
        nodes.shutdown()


if __name__ == "__main__":
    main()
