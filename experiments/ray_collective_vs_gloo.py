"""ray.util.collective on backend "hccl_sim" (hccl_sim.ray_collective) against Ray's own "gloo"
(torch_gloo), same run, same eight actors.

Eight actors (num_cpus=0) on one local Ray node each join two groups: "hccl_sim" (one 910B server,
eight NPUs: the default topology) and "gloo". Each times an fp32 allreduce of each size after a
barrier (col.barrier, untimed): slowest rank per iteration, median over the iterations; the
backends alternate, a round of each at a time. hccl_sim's simulated time for the op is its
last_op. Before that, every op of ray.util.collective runs once per dtype, numpy and torch, on
the hccl_sim group and is checked against numpy in the actor: which ops and dtypes run.

The workers register the backend by Ray's job-level hook (worker_process_setup_hook), so the
actors' code is ray.util.collective's alone.

    python experiments/ray_collective_vs_gloo.py                  # 8 B and 64 MiB, 3 rounds
    python experiments/ray_collective_vs_gloo.py --sizes 8 1M --rounds 2

Writes experiments/out/ray_collective_vs_gloo.{md,json}.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "out"
ROOT = Path(__file__).resolve().parent.parent
WORLD = 8
DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
          "float32", "float64", "bool")
OPS = ("allreduce SUM", "allreduce PRODUCT", "allreduce MIN", "allreduce MAX", "allgather", "reducescatter",
       "broadcast", "reduce", "send/recv", "barrier")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


class Bench:
    """One rank; its methods use ray.util.collective and nothing of hccl_sim's but last_op."""

    def __init__(self, rank):
        self.rank = rank

    def join(self, backend, group):
        import ray.util.collective as col
        col.init_collective_group(WORLD, self.rank, backend=backend, group_name=group)
        import hccl_sim
        return hccl_sim.__file__

    def leave(self, group):
        import ray.util.collective as col
        col.destroy_collective_group(group)

    def time_allreduce(self, group, nbytes, iters, warmup):
        import ray.util.collective as col
        x = np.ones(max(1, nbytes // 4), np.float32)
        walls = []
        for _ in range(warmup + iters):
            col.barrier(group_name=group)
            t0 = time.perf_counter()
            col.allreduce(x, group_name=group)
            walls.append(time.perf_counter() - t0)
            if x[0] != WORLD:
                raise AssertionError(f"rank {self.rank}: allreduce gave {x[0]}, not {WORLD}")
            x.fill(1)
        rec = None
        if group == "hccl_sim":
            import hccl_sim.ray_collective as rc
            op = rc.last_op(group)
            rec = {"time_s": op.time, "algo": op.algo}
        return walls[warmup:], rec

    def conformance(self, group, lib):
        """{(dtype, op): "ok" | the error's first words}: every op once, checked against numpy."""
        import ray.util.collective as col
        from ray.util.collective.types import ReduceOp
        import ml_dtypes
        got = {}
        r, n = self.rank, 6
        for dtype in DTYPES:
            np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
            # values 1 and 2: a product of eight is 256 at most (exact in every float; integers wrap alike)
            inputs = [((np.arange(n) + k) % 2 + 1).astype(np_dtype) for k in range(WORLD)]

            def make(a):
                if lib == "numpy":
                    return np.array(a, copy=True)
                import torch
                if dtype == "bfloat16":
                    return torch.tensor(np.asarray(a, np.float32)).to(torch.bfloat16)
                return torch.from_numpy(np.array(a, copy=True))

            def value(t):
                a = t if isinstance(t, np.ndarray) else (t.float().numpy() if dtype == "bfloat16" else t.numpy())
                return np.asarray(a).astype(np.float64)

            def case(op, fn):
                try:
                    got[(dtype, op)] = "ok" if fn() else "WRONG"
                except Exception as exc:           # noqa: BLE001 - reported in the table
                    got[(dtype, op)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                    col.barrier(group_name=group)   # every rank fails alike; line the ranks up again

            stack = np.stack(inputs)
            for name, ufunc in (("SUM", np.add), ("PRODUCT", np.multiply), ("MIN", np.minimum),
                                ("MAX", np.maximum)):
                def allreduce(name=name, ufunc=ufunc):
                    t = make(inputs[r])
                    col.allreduce(t, group_name=group, op=getattr(ReduceOp, name))
                    return np.array_equal(value(t), ufunc.reduce(stack, axis=0).astype(np.float64))
                case(f"allreduce {name}", allreduce)

            def allgather():
                outs = [make(np.zeros(n, np_dtype)) for _ in range(WORLD)]
                col.allgather(outs, make(inputs[r]), group_name=group)
                return all(np.array_equal(value(o), value(i)) for o, i in zip(outs, inputs))

            def reducescatter():
                out = make(np.zeros(n, np_dtype))
                col.reducescatter(out, [make(inputs[(r + j) % WORLD]) for j in range(WORLD)], group_name=group)
                want = np.add.reduce(np.stack([inputs[(k + r) % WORLD] for k in range(WORLD)]), axis=0)
                return np.array_equal(value(out), value(want))

            def broadcast():
                t = make(inputs[r])
                col.broadcast(t, src_rank=3, group_name=group)
                return np.array_equal(value(t), value(inputs[3]))

            def reduce():
                t = make(inputs[r])
                col.reduce(t, dst_rank=5, group_name=group)
                want = np.add.reduce(stack, axis=0) if r == 5 else inputs[r]
                return np.array_equal(value(t), value(want))

            def send_recv():
                t, into = make(inputs[r]), make(np.zeros(n, np_dtype))
                peer = r ^ 1                              # pairs (0,1), (2,3), ...: the even rank sends first
                if r % 2 == 0:
                    col.send(t, peer, group_name=group)
                    col.recv(into, peer, group_name=group)
                else:
                    col.recv(into, peer, group_name=group)
                    col.send(t, peer, group_name=group)
                return np.array_equal(value(into), value(inputs[peer]))

            def barrier():
                col.barrier(group_name=group)
                return True
            for op, fn in (("allgather", allgather), ("reducescatter", reducescatter), ("broadcast", broadcast),
                           ("reduce", reduce), ("send/recv", send_recv), ("barrier", barrier)):
                case(op, fn)
        return got


def conformance_table(results_by_lib) -> list:
    lines = []
    for lib, got in results_by_lib.items():
        lines += [f"#### {lib}", "", "| dtype | " + " | ".join(OPS) + " |", "|---" * (len(OPS) + 1) + "|"]
        for dtype in DTYPES:
            cells = [got[(dtype, op)] for op in OPS]
            lines.append(f"| {dtype} | " + " | ".join("ok" if c == "ok" else "no" for c in cells) + " |")
        errors = sorted({c for (d, op), c in got.items() if c != "ok"})
        lines += [""] + [f"- {e}" for e in errors] + [""]
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["8", "64M"])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per backend, alternating")
    ap.add_argument("--iters", type=int, default=0, help="iterations per round (default: 20 small, 3 at 64 MiB)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default=str(OUT / "ray_collective_vs_gloo"))
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes]
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    import hccl_sim
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "hccl_sim.ray_collective.register",
                          "env_vars": {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}})
    t_start = time.time()
    try:
        actors = [ray.remote(num_cpus=0)(Bench).remote(r) for r in range(WORLD)]
        where = ray.get([a.join.remote("hccl_sim", "hccl_sim") for a in actors])
        assert set(where) == {hccl_sim.__file__}, (where, hccl_sim.__file__)
        ray.get([a.join.remote("gloo", "gloo") for a in actors])
        conf = {lib: ray.get([a.conformance.remote("hccl_sim", lib) for a in actors])[0] for lib in ("numpy", "torch")}
        timed = {}
        for nbytes in sizes:
            iters = args.iters or (20 if nbytes <= (1 << 20) else 3)
            for backend in ("hccl_sim", "gloo"):
                timed[(backend, nbytes)] = {"slowest_ms": [], "sim": None}
            for _ in range(args.rounds):
                for backend in ("hccl_sim", "gloo"):
                    got = ray.get([a.time_allreduce.remote(backend, nbytes, iters, args.warmup) for a in actors])
                    slowest = [max(w[i] for w, _ in got) * 1e3 for i in range(iters)]
                    timed[(backend, nbytes)]["slowest_ms"] += slowest
                    timed[(backend, nbytes)]["sim"] = got[0][1]
        ray.get([a.leave.remote(g) for a in actors for g in ("hccl_sim", "gloo")])
    finally:
        ray.shutdown()
    rows = []
    for nbytes in sizes:
        hs, gl = timed[("hccl_sim", nbytes)], timed[("gloo", nbytes)]
        h_ms, g_ms = statistics.median(hs["slowest_ms"]), statistics.median(gl["slowest_ms"])
        sim = hs["sim"]
        busbw = 2 * (WORLD - 1) / WORLD * nbytes / (h_ms / 1e3) / 1e9
        g_busbw = 2 * (WORLD - 1) / WORLD * nbytes / (g_ms / 1e3) / 1e9
        rows.append({"bytes": nbytes, "hccl_sim_ms": h_ms, "gloo_ms": g_ms, "ratio": h_ms / g_ms,
                     "hccl_sim_busbw": busbw, "gloo_busbw": g_busbw, "simulated_us": sim["time_s"] * 1e6,
                     "algo": sim["algo"], "samples": len(hs["slowest_ms"])})
    md = [f"### ray.util.collective: hccl_sim vs gloo, {WORLD} actors, fp32 allreduce "
          f"(`{' '.join(['python experiments/ray_collective_vs_gloo.py'] + list(argv or []))}`, {time.time() - t_start:.0f} s)", "",
          "| size | hccl_sim wall (ms) | gloo wall (ms) | hccl_sim / gloo | busbw hccl_sim / gloo (GB/s) | "
          "simulated (µs, 910B 8 NPUs) | algo | iterations |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        md.append(f"| {row['bytes']} B | {row['hccl_sim_ms']:.3f} | {row['gloo_ms']:.3f} | {row['ratio']:.2f} | "
                  f"{row['hccl_sim_busbw']:.3f} / {row['gloo_busbw']:.3f} | {row['simulated_us']:.1f} | {row['algo']} | "
                  f"{row['samples']} |")
    md += ["", f"Wall: slowest rank per iteration, median over the iterations of {args.rounds} alternating rounds "
           "per backend.", "", "### Ops and dtypes on backend hccl_sim (checked against numpy)", ""]
    md += conformance_table(conf)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".md").write_text("\n".join(md) + "\n")
    Path(args.out + ".json").write_text(json.dumps({"rows": rows, "conformance": {
        lib: {f"{d}|{op}": v for (d, op), v in got.items()} for lib, got in conf.items()}}, indent=1))
    print("\n".join(md))
    return rows, conf


if __name__ == "__main__":
    main(sys.argv[1:])
