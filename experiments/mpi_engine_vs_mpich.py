"""The MPI engine against mpi4py + MPICH's own `Allreduce`, on the same processes, in the same run.

For each process count (default 2, 4, 8), one `mpiexec -n N` job measures, interleaved in
`--repeats` rounds: a 64 MiB float32 SUM AllReduce on the MPI engine with no `data_plane` given
(its default: the shared-window plane when every process is on one node, which the job checks)
on device arrays (comm.device.empty + an h2d memcpy, once, untimed: the
buffers hccl_test times HcclAllReduce on; they live in the window, so the op copies nothing in)
and on host arrays (copied into the window each op), on its point-to-point plane (`"p2p"`, host
arrays), and MPICH's `Allreduce` on the same data in host memory (its native case); and an
8-byte AllReduce issued back to back on the engine and on MPICH. A large op's time is the slowest rank's wall time from a barrier; busbw = bytes / time x 2(p-1)/p
(nccl-tests'); figures are medians over every timed op of every round. Every result is checked
against numpy. Writes experiments/out/mpi_engine_vs_mpich.md and a plot beside it (.png: busbw
and 8-byte latency against processes) and prints the command that regenerates them.

    python experiments/mpi_engine_vs_mpich.py                  # 2, 4, 8 processes
    python experiments/mpi_engine_vs_mpich.py --procs 8 --repeats 5
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


SERIES = (("window_dev", "engine, default plane (window), device arrays"),
          ("window", "engine, default plane (window), host arrays"),
          ("p2p", "engine, point to point"), ("mpich", "MPICH Allreduce"))


def busbw(nbytes, p, seconds):
    return nbytes / seconds / 1e9 * 2 * (p - 1) / p


# ---- the worker: one mpiexec job ---------------------------------------------------------------------

def _engine_large(comm, count, iters, device=False):
    from hccl_sim.collectives import expected
    from hccl_sim.collectives.verifiable import rank_input
    x = rank_input(comm.rank, count, "float32")
    d = None
    if device:                                 # the input in HBM, as hccl_test's aclrtMalloc + memcpy h2d
        d = comm.device.empty((count,), np.float32)
        comm.device.memcpy(d, x, "h2d")
        x = d
    walls, y = [], None
    for _ in range(iters + 1):                 # the first op grows the window: not timed
        comm.barrier()
        t0 = time.perf_counter()
        y = comm.all_reduce(x)
        walls.append(time.perf_counter() - t0)
    ok = bool(np.array_equal(y, expected("allreduce", comm.rank, comm.size, count, "float32")))
    if d is not None:
        comm.device.free(d)
    return walls[1:], ok, comm.data_plane


def _engine_small(comm, iters):
    x = np.full(2, comm.rank + 1, dtype=np.float32)
    for _ in range(20):
        comm.all_reduce(x)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        y = comm.all_reduce(x)
    return (time.perf_counter() - t0) / iters, bool(np.all(y == comm.size * (comm.size + 1) / 2))


def worker(args):
    from mpi4py import MPI

    import hccl_sim
    from hccl_sim.collectives import expected
    from hccl_sim.collectives.verifiable import rank_input
    world = MPI.COMM_WORLD
    p, me = world.Get_size(), world.Get_rank()
    topo = hccl_sim.topology("fullmesh", ranks=p, bandwidth=25e9, latency=5e-6)
    count = args.bytes // 4
    x = rank_input(me, count, "float32")
    y = np.empty_like(x)
    res = {"window_dev": [], "window": [], "p2p": [], "mpich": [], "lat_engine": [], "lat_mpich": [], "correct": True}
    for _ in range(args.repeats):
        for key, plane, device in (("window_dev", None, True), ("window", None, False), ("p2p", "p2p", False)):
            got = hccl_sim.run(_engine_large, topology=topo, engine="mpi", data_plane=plane,
                               args=(count, args.iters, device))
            res[key] += [max(w) for w in zip(*(g[0] for g in got))]
            res["correct"] &= all(g[1] for g in got) and all(g[2] == (plane or "window") for g in got)
        for _ in range(args.iters):
            world.Barrier()
            t0 = time.perf_counter()
            world.Allreduce(x, y, op=MPI.SUM)
            res["mpich"].append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        res["correct"] &= bool(np.array_equal(y, expected("allreduce", me, p, count, "float32")))
        got = hccl_sim.run(_engine_small, topology=topo, engine="mpi", args=(args.small_iters,))
        res["lat_engine"].append(max(g[0] for g in got))
        res["correct"] &= all(g[1] for g in got)
        xs, ys = np.full(2, me + 1, dtype=np.float32), np.empty(2, dtype=np.float32)
        for _ in range(20):
            world.Allreduce(xs, ys)
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.small_iters):
            world.Allreduce(xs, ys)
        res["lat_mpich"].append(world.allreduce((time.perf_counter() - t0) / args.small_iters, op=MPI.MAX))
    if me == 0:
        print(json.dumps(res))


def plot(rows, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    procs = [p for p, _, _ in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.2
    for i, (key, label) in enumerate(SERIES):
        ax.bar([j + (i - 1.5) * width for j in range(len(rows))], [busbw(args.bytes, p, m[key]) for p, m, _ in rows],
               width, label=label)
    ax.set_xticks(range(len(rows)), [str(p) for p in procs])
    ax.set_xlabel("MPI processes")
    ax.set_ylabel("busbw (GB/s, wall time)")
    ax.set_title(f"{args.bytes >> 20} MiB float32 AllReduce", fontsize=9)
    ax.legend(fontsize=7)
    ax2.plot(procs, [m["lat_engine"] * 1e6 for _, m, _ in rows], "o-", label="engine")
    ax2.plot(procs, [m["lat_mpich"] * 1e6 for _, m, _ in rows], "s--", label="MPICH")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xticks(procs, [str(p) for p in procs])
    ax2.minorticks_off()
    ax2.set_xlabel("MPI processes")
    ax2.set_ylabel("8-byte AllReduce, back to back (us)")
    ax2.set_title("small-op latency", fontsize=9)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the driver ----------------------------------------------------------------------------------------

def run_job(p, args):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = ["mpiexec", "-n", str(p), sys.executable, str(Path(__file__).resolve()), "--worker",
           "--bytes", str(args.bytes), "--iters", str(args.iters), "--repeats", str(args.repeats),
           "--small-iters", str(args.small_iters)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"mpiexec -n {p} failed: {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--bytes", type=int, default=64 << 20)
    ap.add_argument("--iters", type=int, default=3, help="timed large ops per plane per round")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--small-iters", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(OUT / "mpi_engine_vs_mpich.md"))
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    for p in args.procs:
        r = run_job(p, args)
        med = {k: statistics.median(r[k]) for k in ("window_dev", "window", "p2p", "mpich", "lat_engine", "lat_mpich")}
        rows.append((p, med, r["correct"]))
        print(f"{p} procs: window (device arrays) {busbw(args.bytes, p, med['window_dev']):.2f} GB/s, window (host) "
              f"{busbw(args.bytes, p, med['window']):.2f}, p2p "
              f"{busbw(args.bytes, p, med['p2p']):.2f}, MPICH {busbw(args.bytes, p, med['mpich']):.2f}; 8 B "
              f"{med['lat_engine'] * 1e6:.0f} us vs MPICH {med['lat_mpich'] * 1e6:.0f} us; correct {r['correct']}",
              flush=True)
    command = "python experiments/mpi_engine_vs_mpich.py " + " ".join(
        shlex.quote(a) for a in sys.argv[1:] if a != "--worker")
    lines = [f"# MPI engine vs mpi4py + MPICH Allreduce ({args.bytes >> 20} MiB float32, medians of "
             f"{args.repeats} x {args.iters} ops; 8 B: {args.repeats} x {args.small_iters} back to back)", "",
             "| procs | window, device arrays (GB/s) | window, host arrays (GB/s) | p2p (GB/s) | MPICH (GB/s) "
             "| window dev / MPICH | window host / MPICH | p2p / MPICH "
             "| 8 B engine (us) | 8 B MPICH (us) | latency ratio | correct |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p, m, ok in rows:
        wd, w, q, mp = (busbw(args.bytes, p, m[k]) for k in ("window_dev", "window", "p2p", "mpich"))
        lines.append(f"| {p} | {wd:.2f} | {w:.2f} | {q:.2f} | {mp:.2f} | {wd / mp:.2f}x | {w / mp:.2f}x | "
                     f"{q / mp:.2f}x | "
                     f"{m['lat_engine'] * 1e6:.0f} | {m['lat_mpich'] * 1e6:.0f} | "
                     f"{m['lat_engine'] / m['lat_mpich']:.2f}x | {ok} |")
    lines += ["", f"Regenerate: `{command.strip()}`", ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    png = Path(args.out).with_suffix(".png")
    plot(rows, args, png)
    print("\n".join(lines))
    print(f"wrote {args.out} and {png}\nregenerate with: {command.strip()}")


if __name__ == "__main__":
    main()
