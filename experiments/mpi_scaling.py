"""Strong and weak scaling of the MPI engine, 2..64 emulated ranks under mpiexec, against mpi4py +
MPICH's own `Allreduce` on the same processes.

A configuration PxK is `mpiexec -n P` with `ranks_per_process=K` (R = P*K emulated ranks, threads
inside each process). The emulated cluster is R Ascend 910B NPUs: one Atlas 800T A2 server with R
NPUs up to 8, then R/8 full servers. The op is a float32 SUM AllReduce on verifiable integer-valued
data, checked against numpy on every rank.
- strong scaling: fixed total bytes T (sum of every rank's buffer): each emulated rank holds T/R;
- weak scaling: fixed bytes per rank B: each emulated rank holds B (total R*B).
For each point one mpiexec job measures, interleaved over `--repeats` rounds: the emulation's wall
time per op (slowest rank's, from a barrier), the op's simulated time on the 910B cluster
(`last_op.time`, slowest rank), and MPICH's `Allreduce` on the same P processes moving the same
bytes per process (K ranks' buffers, K*T/R or K*B: with K = 1 the very same op); medians.

    python experiments/mpi_scaling.py                                   # 2x1 4x1 8x1 8x2 8x4 8x8, ~2-3 min
    python experiments/mpi_scaling.py --configs 2x1 4x1 8x1 16x1 8x8 --total 256M --per-rank 4M --repeats 5
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


def cluster(ranks):
    """R 910B NPUs: one server of R NPUs up to 8, else R/8 servers of 8."""
    from topologies import hardware
    if ranks > 8 and ranks % 8:
        raise SystemExit(f"{ranks} emulated ranks: over 8 they must fill 910B servers of 8")
    return hardware("atlas800t-a2", devices_per_server=[min(ranks, 8)] * max(1, ranks // 8))


# ---- the worker: one mpiexec job ---------------------------------------------------------------------

def _engine_op(comm, count, iters):
    from hccl_sim.collectives import expected
    from hccl_sim.collectives.verifiable import rank_input
    x = rank_input(comm.rank, count, "float32")
    walls, sims, y = [], [], None
    for _ in range(iters + 1):                 # the first op warms the pools and caches: not timed
        comm.barrier()
        t0 = time.perf_counter()
        y = comm.all_reduce(x)
        walls.append(time.perf_counter() - t0)
        sims.append(comm.last_op.time)
    return walls[1:], sims[1:], bool(np.array_equal(y, expected("allreduce", comm.rank, comm.size, count, "float32")))


def worker(args):
    from mpi4py import MPI

    import hccl_sim
    from hccl_sim.collectives import expected
    from hccl_sim.collectives.verifiable import rank_input
    world = MPI.COMM_WORLD
    p, me = world.Get_size(), world.Get_rank()
    k = args.k
    ranks = p * k
    topo = cluster(ranks)
    res = {}
    for mode, per_rank in (("strong", args.total // ranks), ("weak", args.per_rank)):
        count = per_rank // 4
        mcount = count * k                     # MPICH: the bytes this process's K ranks hold together
        x = rank_input(me, mcount, "float32")
        y = np.empty_like(x)
        r = res[mode] = {"bytes_per_rank": count * 4, "engine": [], "sim": [], "mpich": [], "correct": True}
        for _ in range(args.repeats):
            got = hccl_sim.run(_engine_op, topology=topo, engine="mpi", ranks_per_process=k,
                               data_plane=args.data_plane, args=(count, args.iters))
            r["engine"] += [max(w) for w in zip(*(g[0] for g in got))]
            r["sim"] += [max(s) for s in zip(*(g[1] for g in got))]
            r["correct"] &= all(g[2] for g in got)
            for i in range(args.iters + 1):
                world.Barrier()
                t0 = time.perf_counter()
                world.Allreduce(x, y, op=MPI.SUM)
                dt = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if i:
                    r["mpich"].append(dt)
            r["correct"] &= bool(world.allreduce(bool(np.array_equal(y, expected("allreduce", me, p, mcount,
                                                                                 "float32"))), op=MPI.LAND))
    if me == 0:
        print(json.dumps(res))


# ---- the driver ----------------------------------------------------------------------------------------

def run_job(p, k, args):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = ["mpiexec", "-n", str(p), sys.executable, str(Path(__file__).resolve()), "--worker", "--k", str(k),
           "--total", str(args.total), "--per-rank", str(args.per_rank), "--iters", str(args.iters),
           "--repeats", str(args.repeats), "--data-plane", args.data_plane]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"mpiexec -n {p} (k={k}) failed: {out.stderr.strip()[-1500:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["job_wall"] = time.perf_counter() - t0
    return res


def parse_config(text):
    try:
        p, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"configuration {text!r} is not PxK (processes x ranks per process)")
    if p < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"configuration {text!r}: P and K must be >= 1")
    return p, k


def human(nbytes):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def table(rows, mode, args):
    what = (f"fixed total {human(args.total)} (T/R per rank)" if mode == "strong"
            else f"fixed {human(args.per_rank)} per rank")
    lines = [f"### {mode} scaling: {what}", "",
             "| config | emulated ranks | bytes per rank | emulation wall / op (ms) | simulated 910B time (us) "
             "| MPICH Allreduce, same procs (ms) | emulation / MPICH | emulated busbw (GB/s) | simulated busbw (GB/s) "
             "| correct |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (p, k), r in rows:
        m = r[mode]
        ranks = p * k
        e, s, mp = (statistics.median(m[key]) for key in ("engine", "sim", "mpich"))
        factor = 2 * (ranks - 1) / ranks
        nb = m["bytes_per_rank"]
        lines.append(f"| {p}x{k} | {ranks} | {human(nb)} | {e * 1e3:.1f} | {s * 1e6:.1f} | {mp * 1e3:.1f} | "
                     f"{e / mp:.2f}x | {nb / e / 1e9 * factor:.3f} | {nb / s / 1e9 * factor:.1f} | {m['correct']} |")
    return lines


def plot(rows, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for i, mode in enumerate(("strong", "weak")):
        ranks = [p * k for (p, k), _ in rows]
        labels = [f"{p}x{k}" for (p, k), _ in rows]
        med = {key: [statistics.median(r[mode][key]) for _, r in rows] for key in ("engine", "sim", "mpich")}
        ax = axes[i][0]
        ax.plot(ranks, [v * 1e3 for v in med["engine"]], "o-", label="hccl-sim MPI engine (R emulated ranks)")
        ax.plot(ranks, [v * 1e3 for v in med["mpich"]], "s--", label="MPICH Allreduce (P processes, same bytes)")
        for x, y, t in zip(ranks, med["engine"], labels):
            ax.annotate(t, (x, y * 1e3), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_ylabel("wall time per op (ms)")
        ax2 = axes[i][1]
        ax2.plot(ranks, [v * 1e6 for v in med["sim"]], "o-", color="#55a868")
        ax2.set_ylabel("simulated AllReduce time on 910B (us)")
        what = f"total {human(args.total)}" if mode == "strong" else f"{human(args.per_rank)} per rank"
        for a, title in ((ax, "emulation wall time"), (ax2, "simulated time")):
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_xticks(sorted(set(ranks)), [str(v) for v in sorted(set(ranks))], minor=False)
            a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            a.set_xlabel("emulated ranks (P processes x K ranks per process)")
            a.set_title(f"{mode} scaling ({what}): {title}", fontsize=9)
            a.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=parse_config, nargs="+",
                    default=[parse_config(c) for c in ("2x1", "4x1", "8x1", "8x2", "8x4", "8x8")],
                    help="PxK: mpiexec -n P, K ranks per process")
    ap.add_argument("--total", type=str, default="64M", help="strong scaling: total bytes over all ranks (K/M/G)")
    ap.add_argument("--per-rank", type=str, default="1M", help="weak scaling: bytes per rank (K/M/G)")
    ap.add_argument("--iters", type=int, default=3, help="timed ops per round")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds (engine, MPICH)")
    ap.add_argument("--data-plane", default="p2p", choices=["p2p", "window"])
    ap.add_argument("--timeout", type=float, default=900, help="seconds per mpiexec job")
    ap.add_argument("--k", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(OUT / "mpi_scaling"), help="path without extension (.md, .png)")
    args = ap.parse_args()
    from hccl_sim.tools.bench import parse_size
    args.total, args.per_rank = parse_size(args.total), parse_size(args.per_rank)
    if args.worker:
        worker(args)
        return
    for p, k in args.configs:
        cluster(p * k)                        # a bad rank count fails here, before any job starts
        if args.total // (p * k) < 4096:
            raise SystemExit(f"--total {args.total}: {p}x{k} would give under 4 KiB per rank")
    command = "python experiments/mpi_scaling.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    t0 = time.perf_counter()
    rows = []
    for p, k in args.configs:
        r = run_job(p, k, args)
        rows.append(((p, k), r))
        print(f"{p}x{k}: " + "; ".join(
            f"{mode} {human(r[mode]['bytes_per_rank'])}/rank: engine {statistics.median(r[mode]['engine']) * 1e3:.1f} ms, "
            f"sim {statistics.median(r[mode]['sim']) * 1e6:.1f} us, MPICH {statistics.median(r[mode]['mpich']) * 1e3:.1f} ms"
            for mode in ("strong", "weak")) + f" (job {r['job_wall']:.1f} s)", flush=True)
    lines = [f"# MPI engine scaling vs MPICH (float32 SUM AllReduce, data plane {args.data_plane}, medians of "
             f"{args.repeats} x {args.iters} ops)", ""]
    lines += table(rows, "strong", args) + [""] + table(rows, "weak", args) + [""]
    lines += ["Emulated busbw = bytes per rank / wall x 2(R-1)/R; simulated busbw the same on simulated time. "
              f"MPICH moves the bytes of the process's K ranks over P processes. Total wall "
              f"{time.perf_counter() - t0:.0f} s.", "", f"Regenerate: `{command.strip()}`", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, args, out.with_suffix(".png"))
    out.with_suffix(".md").write_text("\n".join(lines))
    (out.with_suffix(".json")).write_text(json.dumps([{"procs": p, "k": k, **r} for (p, k), r in rows], indent=1))
    print("\n".join(lines))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}\nregenerate with: {command.strip()}")


if __name__ == "__main__":
    main()
