"""AllReduce on the Atlas 900 A3 SuperPoD: a size sweep on 1, 2 and 4 superpods of 48 servers
(768 dies each, CloudMatrix384's size), with HCCL's own A3 choice, and the same with
HCCL_INTER_HCCS_DISABLE=TRUE (RoCE between a superpod's servers).

Simulated time only (`hccl_sim.simulate`, no payload), plus the wall time each row took. The A3
preset is calibrated on one server only (AllGather, ReduceScatter; calibration_points.yaml); across
servers and superpods it is unvalidated (topologies/presets/atlas900-a3.yaml).

    python experiments/a3_sweep.py                  # prints a markdown table
    python experiments/a3_sweep.py --servers 4      # smaller superpods
"""
import argparse
import time

import hccl_sim
from calibration import size as human      # 1 KiB, 64 MiB, ...

SIZES = [1 << k for k in (10, 14, 18, 20, 22, 24, 26, 28, 30, 32)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=48, help="servers per superpod (default 48)")
    ap.add_argument("--superpods", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    print("| superpods | dies | size | time (us) | busbw (GB/s) | HCCS disabled: time (us) | algorithm | wall (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for pods in args.superpods:
        topo = hccl_sim.topology("atlas900-a3", superpods=pods, servers=args.servers)
        for nbytes in SIZES:
            t0 = time.perf_counter()
            est = hccl_sim.simulate("allreduce", nbytes, topology=topo)
            off = hccl_sim.simulate("allreduce", nbytes, topology=topo, env={"HCCL_INTER_HCCS_DISABLE": "TRUE"})
            wall = time.perf_counter() - t0
            print(f"| {pods} | {topo.num_ranks} | {human(nbytes)} | {est.time * 1e6:.1f} | {est.busbw:.1f} | "
                  f"{off.time * 1e6:.1f} | {est.algo} | {wall:.2f} |", flush=True)


if __name__ == "__main__":
    main()
