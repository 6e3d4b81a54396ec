"""The 950's executors against what they replace: each priced as HCCL runs it and as the same
program without the executor's own trick (the Z-axis detour off, the Parallel split off, OmniPipe
off: the levels in turn), and HCCL_USE_NEW_SELECTOR's pick against the rules'. Simulated times
(us), UNVALIDATED (docs/references.md §3.5, §6.13); the figures experiments/RESULTS.md quotes.

    python experiments/a950_executors.py
"""
import logging
import warnings

import hccl_sim
import topologies
from hccl_sim import collectives
from hccl_sim.config.env import Config
from hccl_sim.plan.costs import effective_cost
from hccl_sim.plan.planner import Signature, choose, plan_times
from topologies.subset import subset

MiB, GiB = 1 << 20, 1 << 30


def sized(op, nbytes, topo, root=None):
    shape, _ = collectives.of(op).simulated_size(nbytes, None, topo.num_ranks, 4)
    return Signature(op, shape, "float32", "sum" if collectives.of(op).reducing else None, root, None)


def priced(sig, topo, choice, config=None):
    """The slowest rank's simulated time (us) of `choice` as it is."""
    config = config or Config()
    return max(plan_times(sig, effective_cost(topo, config), config, 4, choice, [0] * topo.num_ranks,
                          faults=False)[2]) / 1e3


def row(topo, op, nbytes, choice, mine, without):
    print(f"| {topo.num_ranks} | {op} | {nbytes:,} | {choice.executor} | {mine:,.1f} | {without:,.1f} |")


def main():
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    one, pod = hccl_sim.topology("atlas950"), hccl_sim.topology("atlas950", servers=4)
    print("Z-axis detour (MeshConcur): | ranks | op | bytes | HCCL's choice | with | without |")
    for topo, op, nbytes in ((subset(one, [0, 1]), "allreduce", 8 * MiB), (subset(one, [0, 1]), "allgather", 8 * MiB),
                             (one, "allgather", 2 * GiB), (pod, "allreduce", 8 * GiB), (pod, "allgather", 8 * GiB),
                             (pod, "reducescatter", 8 * GiB)):
        sig = sized(op, nbytes, topo)
        c = choose(sig, topo, Config(), 4)
        row(topo, op, nbytes, c, priced(sig, topo, c), priced(sig, topo, c._replace(detour=None)))
    print("Parallel (4 servers of 8): | ranks | op | bytes | HCCL's choice | parallel | levels in turn |")
    for op in ("broadcast", "reduce", "scatter"):
        for nbytes in (64 * MiB, GiB):
            sig = sized(op, nbytes, pod, root=5)
            c = choose(sig, pod, Config(), 4)
            row(pod, op, nbytes, c, priced(sig, pod, c), priced(sig, pod, c._replace(split=1.0)))
    print("UBoE Parallel (2 SuperPoDs: 4 servers of 2; 2 servers of 8): | ranks | op | bytes | choice | time | split |")
    twos = topologies.hardware("atlas950", devices_per_server=[2] * 8, pod_of_server=[0, 0, 0, 0, 1, 1, 1, 1])
    for topo in (twos, hccl_sim.topology("atlas950", servers=2, superpods=2)):
        for op in ("allreduce", "allgather", "reducescatter", "broadcast", "reduce"):
            sig = sized(op, 64 * MiB, topo, root=3 if collectives.of(op).rooted else None)
            c = choose(sig, topo, Config(), 4)
            print(f"| {topo.num_ranks} | {op} | {64 * MiB:,} | {c.executor} | {priced(sig, topo, c):,.1f} | {c.split} |")
    print("HCCL_USE_NEW_SELECTOR=1 (4 servers of 8, 64 MiB): | op | the rules' | us | the least cost's | us |")
    least = Config.from_env({"HCCL_USE_NEW_SELECTOR": "1"})
    for op in ("allreduce", "allgather", "reducescatter"):
        sig = sized(op, 64 * MiB, pod)
        a, b = choose(sig, pod, Config(), 4), choose(sig, pod, least, 4)
        print(f"| {op} | {a.executor} | {priced(sig, pod, a):,.1f} | {b.executor} | {priced(sig, pod, b, least):,.1f} |")
    print("OmniPipe: | ranks | op | bytes | choice | OmniPipe | levels in turn |")
    for servers, superpods in ((2, 2), (4, 2), (8, 2), (4, 4)):
        topo = hccl_sim.topology("atlas950", servers=servers, superpods=superpods)
        for op in ("allgather", "reducescatter", "allreduce"):
            for nbytes in (MiB, 64 * MiB, GiB):
                sig = sized(op, nbytes, topo)
                c = choose(sig, topo, Config(), 4)
                row(topo, op, nbytes, c, priced(sig, topo, c), priced(sig, topo, c._replace(pipelined=False)))


if __name__ == "__main__":
    main()
