"""What `hccl-sim train` prints and writes: the per-step table, the closing lines, `--json`,
`--plot` (loss, and each step's compute / exposed communication) and `--trace` (Perfetto).

A step's figures are its slowest rank's (the step ends when that rank ends): compute is the
kernels' time on its compute stream, communication every collective's duration (gradient
buckets, SyncBatchNorm's, the loss AllReduce), exposed communication the step's time beyond its
compute, overlap the share of communication hidden under compute.
"""
from __future__ import annotations

import json
from dataclasses import asdict

from ..npu import chrome_trace as chrome

COLUMNS = ("step", "ranks", "loss", "acc", "compute(us)", "comm(us)", "exposed(us)", "overlap", "step(us)",
           "retries", "wall(ms)")


def step_rows(results: list) -> list:
    """One row per step run (a step redone after a recovery appears again), from the ranks that
    finished (None for a crashed rank)."""
    alive = [r for r in results if r is not None]
    rows = []
    for records in zip(*[r.steps for r in alive]):
        slowest = max(records, key=lambda s: (s.end - s.start, s.end))
        time_ns = slowest.end - slowest.start
        exposed = max(0, time_ns - slowest.compute_ns)
        comm = slowest.comm_ns
        overlap = 0.0 if comm == 0 else max(0.0, min(1.0, 1 - exposed / comm))
        rows.append({"step": slowest.step, "ranks": slowest.ranks, "loss": slowest.loss,
                     "accuracy": slowest.accuracy, "compute_ns": slowest.compute_ns, "comm_ns": comm,
                     "exposed_ns": exposed, "overlap": overlap, "step_ns": time_ns,
                     "retries": max(s.retries for s in records), "wall_s": max(s.wall_s for s in records),
                     "start_ns": min(s.start for s in records), "end_ns": max(s.end for s in records)})
    return rows


def events(results: list) -> list:
    """Recoveries, once each (every survivor records the same one)."""
    alive = [r for r in results if r is not None]
    return [e for e in alive[0].events] if alive else []


def header(cfg, topo, engine: str, nparams: int, bucket_bytes: list) -> str:
    p = topo.num_ranks
    per = cfg.batch / p
    dims = "-".join(str(d) for d in [64] + [cfg.hidden] * cfg.depth + [10])
    if cfg.bucket_mb is None:
        plan = "one bucket after backward (no overlap)"
    else:
        plan = f"cap {cfg.bucket_mb:g} MiB, first 1 MiB"
    sizes = ", ".join(_mib(b) for b in bucket_bytes)
    return "\n".join([
        f"# hccl-sim train: MLP {dims} ({cfg.depth} x SyncBatchNorm, {nparams / 1e6:.2f} M parameters) on "
        f"UCI digits; {p} ranks ({topo.name}, {topo.num_servers} server{'s' if topo.num_servers > 1 else ''},"
        f" {topo.device}), engine {engine}",
        f"# global batch {cfg.batch} ({per:g} per rank), SGD lr {cfg.lr:g} momentum {cfg.momentum:g}, "
        f"{len(bucket_bytes)} gradient bucket{'s' if len(bucket_bytes) != 1 else ''} ({sizes}; {plan}), "
        f"algo {cfg.algo or 'selected by HCCL rules'}",
        "#" + "".join(f"{c:>12}" if i > 1 else f"{c:>6}" for i, c in enumerate(COLUMNS)),
    ])


def format_row(row: dict) -> str:
    cells = [f"{row['step']:>6}", f"{row['ranks']:>6}", f"{row['loss']:>12.4f}", f"{row['accuracy']:>12.3f}",
             f"{row['compute_ns'] / 1e3:>12.2f}", f"{row['comm_ns'] / 1e3:>12.2f}",
             f"{row['exposed_ns'] / 1e3:>12.2f}", f"{100 * row['overlap']:>11.1f}%",
             f"{row['step_ns'] / 1e3:>12.2f}", f"{row['retries']:>12}", f"{row['wall_s'] * 1e3:>12.1f}"]
    return " " + "".join(cells)


def footer(rows: list, results: list, wall_s: float) -> str:
    alive = [r for r in results if r is not None]
    lines = []
    for e in events(results):
        lines.append(f"# recovered: rank{'s' if len(e['lost_ranks']) > 1 else ''} "
                     f"{', '.join(map(str, e['lost_ranks']))} lost in step {e['step']} ({e['error']}, found at "
                     f"{e['detected_ns'] / 1e9:.6f} s simulated); shrunk to {e['ranks']} ranks "
                     f"({e['shrink_ns'] / 1e3:.2f} us), restored the checkpoint of step {e['resumed_step']}, resumed at "
                     f"{e['resumed_at_ns'] / 1e9:.6f} s ({e['wall_s'] * 1e3:.0f} ms wall)")
    steady = rows[1:] or rows
    mean = lambda key: sum(r[key] for r in steady) / len(steady)    # noqa: E731
    lines.append(f"# steady state (steps after the first): step {mean('step_ns') / 1e3:.2f} us, compute "
                 f"{mean('compute_ns') / 1e3:.2f} us, communication {mean('comm_ns') / 1e3:.2f} us, exposed "
                 f"{mean('exposed_ns') / 1e3:.2f} us, overlap {100 * mean('overlap'):.1f} %")
    digests = {r.digest for r in alive}
    lines.append(f"# final loss {rows[-1]['loss']:.4f}; accuracy on all 1797 digits {100 * alive[0].accuracy:.1f} %; "
                 f"parameters {'bit-identical on every rank' if len(digests) == 1 else 'DIFFER between ranks'}; "
                 f"simulated {rows[-1]['end_ns'] / 1e9 * 1e3:.3f} ms in all, wall {wall_s:.1f} s")
    return "\n".join(lines)


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.2f} MiB"


def write_json(path: str, cfg, topo, engine: str, rows: list, results: list) -> None:
    doc = {"config": asdict(cfg), "topology": topo.name, "ranks": topo.num_ranks, "engine": engine,
           "steps": rows, "events": events(results),
           "buckets_bytes": next(r.buckets for r in results if r is not None)}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def write_plot(path: str, rows: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x = list(range(len(rows)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(x, [r["loss"] for r in rows], marker=".")
    top.set_ylabel("loss (global batch)")
    top.set_title("hccl-sim train")
    compute = [r["compute_ns"] / 1e3 for r in rows]
    exposed = [r["exposed_ns"] / 1e3 for r in rows]
    bottom.bar(x, compute, label="compute")
    bottom.bar(x, exposed, bottom=compute, label="exposed communication")
    bottom.plot(x, [r["comm_ns"] / 1e3 for r in rows], "k.", label="communication (all)")
    bottom.set_ylabel("simulated us")
    bottom.set_xlabel("step run")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_trace(path: str, results: list, step: int) -> None:
    """Every rank's compute and comm streams during `step`, one thread per (rank, stream)."""
    events_ = []
    for r in results:
        if r is None:
            continue
        for stream, name, start, end in r.trace:
            tid = 2 * r.rank + (stream == "comm")
            events_.append((tid, name, start, end, {"stream": stream, "rank": r.rank}))
    names = {2 * r.rank + k: f"rank {r.rank} {s}" for r in results if r is not None
             for k, s in enumerate(("compute", "comm"))}
    chrome.write(path, [(f"train step {step}", events_)], thread_names=names)
