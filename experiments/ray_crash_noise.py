"""Count what Ray itself prints about rank deaths on the driver: the fault plan's crashes (which
the plan's entry reports, so Ray should print nothing about them) and deaths no plan asked for
(os._exit in the user's function: still the run's error, and Ray's line about them should show).

A child process starts a two-node Ray cluster of its own (ray.cluster_utils), runs `--crashes`
planned crashes on each data plane (shm: one node; socket and object: two servers on two nodes),
then one unplanned death per plane, and prints the process id of every rank that died. This
process reads the child's stdout and stderr and attributes each of Ray's lines ("A worker died or
was killed ... SYSTEM_ERROR ... OOM killer") to a death by the "Worker PID" it names.

    python experiments/ray_crash_noise.py                 # every line Ray would print (RAY_DEDUP_LOGS=0)
    python experiments/ray_crash_noise.py --dedup         # Ray's default: repeats within 5 s held back

Ray's own `hccl-sim chaos --engine ray` count: `hccl-sim chaos --engine ray -n 40 --topology
fullmesh --ranks 4 2>&1 | grep -c "A worker died"`.
"""
import argparse
import os
import re
import subprocess
import sys
import time

NOISE = re.compile(r"worker died|SYSTEM_ERROR|OOM", re.I)
DEATH = re.compile(r"^death (planned|unplanned) (\w+) pid (\d+)$")


def child(crashes):
    import numpy as np
    import ray
    from ray.cluster_utils import Cluster

    import hccl_sim
    import topologies
    from hccl_sim import HcclError

    def ops(comm):
        for _ in range(3):
            try:
                comm.all_reduce(np.arange(20_000, dtype=np.int64))
            except HcclError:
                pass

    def user_exit(comm):
        if comm.rank == 1:
            os._exit(3)
        comm.all_reduce(np.arange(20_000, dtype=np.int64))

    cluster = Cluster()
    for k in range(2):
        cluster.add_node(num_cpus=1, resources={f"node{k}": 64}, object_store_memory=256 << 20,
                         include_dashboard=False)
    ray.init(address=cluster.address, log_to_driver=False)
    two_nodes = topologies.hardware("atlas800t-a2", devices_per_server=[2, 2])
    try:
        for plane, topo in (("shm", hccl_sim.topology("fullmesh", ranks=4)), ("socket", two_nodes),
                            ("object", two_nodes)):
            with hccl_sim.Cluster(topo, engine="ray", data_plane=plane) as cl:
                for i in range(crashes):
                    dead = 1 + i % (topo.num_ranks - 1)
                    pid = cl.pids[dead]
                    got = cl.run(ops, faults=hccl_sim.FaultPlan().rank_crash(dead, at_op=1, at_step=i % 2))
                    assert got[dead] is None, got
                    print(f"death planned {plane} pid {pid}", flush=True)
                pid = cl.pids[1]
                try:
                    cl.run(user_exit)
                    raise AssertionError("an unplanned death was no error of the run")
                except HcclError as exc:
                    assert exc.rank == 1, exc
                print(f"death unplanned {plane} pid {pid}", flush=True)
        time.sleep(5)           # Ray's driver prints from a thread of its own, as the raylet's notices come
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crashes", type=int, default=3, help="planned crashes per data plane (default 3)")
    ap.add_argument("--dedup", action="store_true", help="keep Ray's log deduplication (its default)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.crashes)
        return
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    if not args.dedup:
        env["RAY_DEDUP_LOGS"] = "0"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, __file__, "--child", "--crashes", str(args.crashes)], env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode:
        sys.exit(f"the child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    lines = (out.stdout + out.stderr).splitlines()
    deaths = [m.groups() for m in map(DEATH.match, lines) if m]
    noise = [line for line in lines if NOISE.search(line)]
    print(f"{len(deaths)} deaths, {time.monotonic() - t0:.0f} s; Ray's lines about each "
          f"({'deduplicated, as by default' if args.dedup else 'RAY_DEDUP_LOGS=0'}):")
    named = set()
    for kind, plane, pid in deaths:
        about = [line for line in noise if f"Worker PID: {pid} " in line]
        named.update(about)
        print(f"  {kind:9} {plane:6} pid {pid}: {len(about)}")
    for kind in ("planned", "unplanned"):
        pids = [pid for k, _, pid in deaths if k == kind]
        hit = sum(any(f"Worker PID: {pid} " in line for line in noise) for pid in pids)
        print(f"{kind}: {hit} of {len(pids)} deaths have a line from Ray")
    if len(named) < len(noise):
        print(f"{len(noise) - len(named)} of Ray's lines name no death of this run:")
        for line in noise:
            if line not in named:
                print("  " + line[:200])


if __name__ == "__main__":
    main()
