"""Simulated times against published measurements of HCCL on Ascend 910B and A3; 910A has none.

Reads every point of `calibration_points.yaml` (beside this script: source, hardware, what the
figure means, confidence), simulates the same op on the point's preset (`atlas800t-a2` unless it
names another: `atlas900-a3`) with as many NPUs (A3: dies) and the same HCCL_BUFFSIZE and dtype,
and prints published vs simulated and their ratio (simulated /
published, for durations and bandwidths alike: > 1 means the model is slow), then for each of the
three hardware presets its points and what its preset file says is calibrated. Goals: 0.9-1.1 for
large-message points, +-25 % for small-message floors; mid-size points are reported only. Writes
`out/calibration.json` and a plot `out/calibration.png`.

    python experiments/calibration.py            # table and plot
    python experiments/calibration.py --check    # exit status 1 if a point misses its goal
"""
import argparse
import json
from pathlib import Path

import numpy as np
import yaml

import hccl_sim
from hcomm.cost import CostModel
from topologies.presets import HARDWARE_PRESETS, hardware, preset_data

HERE = Path(__file__).resolve().parent
POINTS = HERE / "calibration_points.yaml"
OUT = HERE / "out"
GOALS = {"large": (0.9, 1.1), "small": (0.75, 1.25)}       # ratio bounds; "mid" has none
UNIT_S = {"ms": 1e-3, "us": 1e-6, "s": 1.0}


def load(path=POINTS) -> list:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def simulated_seconds(point) -> float:
    """Rank 0's simulated duration of the point's op on `npus` NPUs (dies) of one server of its preset."""
    topo = hardware(point.get("preset", "atlas800t-a2"), devices_per_server=[max(point["npus"], 1)])
    env = {} if point.get("hccl_buffsize_mb") is None else {"HCCL_BUFFSIZE": str(point["hccl_buffsize_mb"])}
    if point.get("expansion"):                       # the A3 points: measured with HCCL_OP_EXPANSION_MODE=AIV
        env["HCCL_OP_EXPANSION_MODE"] = point["expansion"]
    op, nbytes = point["op"], int(point["bytes"])
    if op == "local_copy":
        return topo.device_model.copy_ns(nbytes) / 1e9
    if op == "send":                    # staged through the CCL buffer as the preset says
        _, send_end = CostModel.of(topo).p2p_ns(0, 1, nbytes, 0, 0)
        return send_end / 1e9
    dtype = point.get("dtype", "float32")
    if hccl_sim.collectives.get(op).variable:     # hccl_test's alltoallv_test: the send buffer split evenly
        from hccl_sim.collectives.splits import parse
        p = topo.num_ranks
        elements = nbytes // np.dtype(dtype).itemsize
        return hccl_sim.simulate(op, topology=topo, env=env, dtype=dtype,
                                 counts=parse("uniform").matrix(p, elements)).times[0]
    return hccl_sim.simulate(op, nbytes, topology=topo, env=env, dtype=dtype).times[0]


def compare(point) -> dict:
    """The point with its simulated figure (in the point's unit) and ratio simulated / published."""
    t = simulated_seconds(point)
    if point["meaning"] == "algbw":
        figure = point["bytes"] / t / 1e9
        ratio = point["figure"] / figure          # a faster model has a higher bandwidth: invert
    else:
        figure = t / UNIT_S[point["unit"]]
        ratio = figure / point["figure"]
    lo, hi = GOALS.get(point["regime"], (None, None))
    within = None if lo is None else lo <= ratio <= hi
    return {**point, "simulated": figure, "ratio": ratio, "within": within}


def size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    markers = {"large": "o", "small": "s", "mid": "^"}
    ops = sorted({r["op"] for r in rows})
    colors = dict(zip(ops, plt.cm.tab10.colors))
    for r in rows:
        ax.scatter(r["bytes"], r["ratio"], marker=markers[r["regime"]], color=colors[r["op"]],
                   edgecolor="black" if r["within"] is False else "none", s=45)
    for lo, hi in GOALS.values():
        ax.axhspan(lo, hi, color="grey", alpha=0.08)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes (hccl_test -b)")
    ax.set_ylabel("simulated / published (time)")
    ax.set_title("atlas800t-a2 and atlas900-a3 against published 910B and A3 measurements")
    for op in ops:
        ax.scatter([], [], color=colors[op], label=op)
    for regime, m in markers.items():
        ax.scatter([], [], marker=m, color="grey", label=regime)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a point misses its goal")
    args = ap.parse_args()
    rows = [compare(p) for p in load()]
    print(f"# {'point':32s} {'preset':12s} {'op':13s} {'NPUs':>4s} {'size':>9s} {'published':>13s} {'simulated':>13s} "
          f"{'ratio':>6s} {'goal':>9s}  confidence")
    for r in rows:
        lo, hi = GOALS.get(r["regime"], (None, None))
        goal = "-" if lo is None else f"{lo:.2f}-{hi:.2f}"
        mark = "" if r["within"] is not False else "  MISSED"
        print(f"  {r['id']:32s} {r.get('preset', 'atlas800t-a2'):12s} {r['op']:13s} {r['npus']:4d} {size(r['bytes']):>9s} "
              f"{r['figure']:>8.4g} {r['unit']:4s} {r['simulated']:>8.4g} {r['unit']:4s} {r['ratio']:6.3f} "
              f"{goal:>9s}  {r['confidence']}{mark}")
    missed = [r["id"] for r in rows if r["within"] is False]
    for name in HARDWARE_PRESETS:                    # every preset, those with no published point too
        mine = [r for r in rows if r.get("preset", "atlas800t-a2") == name]
        goals = [r for r in mine if r["within"] is not None]
        print(f"# {name}: {len(mine)} points, {sum(r['within'] is True for r in goals)} of {len(goals)} with a goal "
              f"meet it; calibrated: {preset_data(name).get('calibration', 'unvalidated')}")
    print(f"# {sum(r['within'] is True for r in rows)} of {sum(r['within'] is not None for r in rows)} points "
          f"with a goal meet it" + (f"; missed: {', '.join(missed)}" if missed else ""))
    OUT.mkdir(exist_ok=True)
    (OUT / "calibration.json").write_text(json.dumps(rows, indent=2))
    plot(rows, OUT / "calibration.png")
    if args.check and missed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
