"""The hccl_sim torch backend under torchrun against torch's gloo, same run: two hosts, or one.

Two torchrun agents (`--hosts 2`, `--ranks` / 2 processes each) on this machine are two hosts as far
as the job knows (torchrun's GROUP_RANK differs), so hccl-sim runs its socket plane: a host's ranks
read each other in place on step words (hcomm.exec.hosted), the hosts meet over TCP. With `--hosts
1` one agent starts every process (the shared-memory plane). The topology is 8-card 910B servers,
one per 8 ranks (HCCL_SIM_TOPOLOGY=atlas800t-a2:servers=ranks/8). The same script then runs on gloo,
the runs alternating (hccl_sim, gloo, hccl_sim, ...). Each times an fp32 all_reduce of each size
after a barrier: slowest rank per iteration, median over the iterations.

    python experiments/torchrun_vs_gloo.py                       # 16 ranks on 2 hosts; 8 B and 64 MiB, 5 runs
    python experiments/torchrun_vs_gloo.py --sizes 8 1M 16M --runs 3
    python experiments/torchrun_vs_gloo.py --hosts 1 --ranks 8 --sizes 8

A PYTHONPATH given to it goes first on the ranks' path (another build's tree, to compare two).

Writes experiments/out/torchrun_vs_gloo_<ranks>x<hosts>.{md,json}.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
ROOT = Path(__file__).resolve().parent.parent


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def worker(backend: str, sizes: list, iters, warmup: int) -> None:
    """One rank: time every size, rank 0 prints a RESULT line of {size: median slowest-rank ms}."""
    import torch
    import torch.distributed as dist
    if backend == "hccl_sim":
        import hccl_sim.torch  # noqa: F401 (registers the backend)
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    got = {}
    for nbytes in sizes:
        n = iters(nbytes)
        walls, _ = timed_all_reduces(nbytes, n, warmup)
        every = [None] * world
        dist.all_gather_object(every, walls)
        slowest = [max(w[i] for w in every) for i in range(n)]
        got[nbytes] = statistics.median(slowest) * 1e3
    if rank == 0:
        print("RESULT " + json.dumps(got), flush=True)
    dist.destroy_process_group()


def timed_all_reduces(nbytes: int, iters: int, warmup: int):
    """This rank's wall times of `iters` fp32 all_reduces of `nbytes` on the default group, each
    after a barrier (after `warmup` untimed ones), and whether every result was right."""
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((max(1, nbytes // 4),), float(rank + 1))
    walls, ok = [], True
    for _ in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        walls.append(time.perf_counter() - t0)
        ok &= float(x[0]) == world * (world + 1) / 2
        x.fill_(float(rank + 1))
    return walls[warmup:], ok


def iters_for(nbytes: int) -> int:
    return 5 if nbytes >= 16 << 20 else 20 if nbytes >= 1 << 20 else 50


def launch(backend: str, sizes: list, ranks: int, hosts: int, timeout_s: float) -> dict:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])),
           "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "HCCL_SIM_TOPOLOGY": f"atlas800t-a2:servers={max(1, ranks // 8)}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts), "--nproc-per-node",
           str(ranks // hosts), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    agents = [subprocess.Popen(cmd + ["--node-rank", str(k), __file__, "--worker", backend, "--sizes",
                                      *map(str, sizes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env) for k in range(hosts)]
    outs = []
    for a in agents:
        try:
            outs.append(a.communicate(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            for b in agents:
                b.kill()
            raise SystemExit(f"{backend}: torchrun did not finish within {timeout_s:g} s")
    if any(a.returncode for a in agents):
        raise SystemExit(f"{backend}: torchrun failed:\n" + "\n".join(o[1][-3000:] for o in outs))
    line = next(x for x in outs[0][0].splitlines() if x.startswith("RESULT "))
    return {int(k): v for k, v in json.loads(line[len("RESULT "):]).items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["8", "64M"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=16, help="processes in all (a multiple of 8 over 8)")
    ap.add_argument("--hosts", type=int, default=2, choices=(1, 2), help="torchrun agents (hosts)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    if args.worker:
        worker(args.worker, sizes, iters_for, 2)
        return
    rows = []
    for run in range(args.runs):
        ours = launch("hccl_sim", sizes, args.ranks, args.hosts, args.timeout)
        theirs = launch("gloo", sizes, args.ranks, args.hosts, args.timeout)
        for n in sizes:
            rows.append({"size": n, "run": run, "hccl_sim_ms": ours[n], "gloo_ms": theirs[n],
                         "ratio": theirs[n] / ours[n]})
            print(f"  run {run} {n:>10} B: hccl_sim {ours[n]:9.3f} ms, gloo {theirs[n]:9.3f} ms, "
                  f"gloo / hccl_sim {theirs[n] / ours[n]:.2f}", flush=True)
    lines = [f"# all_reduce fp32, {args.ranks} ranks under torchrun on {args.hosts} host(s) (--nnodes {args.hosts}, "
             f"{args.ranks // args.hosts} processes each) on one machine: the hccl_sim backend against gloo, same run", "",
             "| size (B) | hccl_sim median (ms) | gloo median (ms) | ratios per run (gloo / hccl_sim) |",
             "|---|---|---|---|"]
    for n in sizes:
        mine = [r for r in rows if r["size"] == n]
        lines.append(f"| {n} | {statistics.median(r['hccl_sim_ms'] for r in mine):.3f} | "
                     f"{statistics.median(r['gloo_ms'] for r in mine):.3f} | "
                     + ", ".join(f"{r['ratio']:.2f}" for r in mine) + " |")
    OUT.mkdir(exist_ok=True)
    name = f"torchrun_vs_gloo_{args.ranks}x{args.hosts}"
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")
    (OUT / f"{name}.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
