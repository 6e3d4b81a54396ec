"""The A3 preset's fitted constants, from the published points they are fitted to.

Reads the A3 points of `calibration_points.yaml` (Huawei's msmodeling alignment report: one Atlas
800 A3 server, AllGather and ReduceScatter of 1-40 MiB per rank, AI CPU expansion) and derives,
in the model's own structure (HCCL's level0 double ring, staging, fixed costs):

1. the UB rate per ring from the slope of the AllGathers that fit in one CCL-buffer loop on 16
   dies (the link's rate scaled until the model's slope is the published one);
2. the inline-reduce rate from the slope of the one-loop ReduceScatters, likewise;
3. the per-step dispatch and the AllGather call's fixed cost from the AllGather intercepts on 16
   and 8 dies (15 and 7 ring steps);
4. the ReduceScatter call's fixed cost from the one-loop ReduceScatters on 16 dies;
5. with HCCL_OP_EXPANSION_MODE=AIV, each AIV kernel call's fixed cost from the smallest kernel
   time of its collective (AllGather 1 KiB and ReduceScatter 14 KiB per rank on 8 dies, AllReduce
   160 KiB on 16);
6. what a die's UB port carries to many peers at once from the slope of the AIV mesh AllGathers on
   16 dies (74-297 KiB per rank: every die writes to its 14 UB peers at once), the model's slope
   being linear in the port's 1 / rate; then 5 again with that port (the floors barely move).

It prints each constant and every point's ratio with them; atlas900-a3.yaml holds the values
(rounded). Simulations replace the preset's constants in this process only.

    python experiments/a3_fit.py
"""
import numpy as np
import yaml
from pathlib import Path

import hccl_sim
import topologies
from topologies import presets

POINTS = Path(__file__).resolve().parent / "calibration_points.yaml"
AG_16 = ["a3-16d-ag-1.26MiB", "a3-16d-ag-3.77MiB", "a3-16d-ag-5.02MiB", "a3-16d-ag-8.76MiB"]
RS_16 = ["a3-16d-rs-1.26MiB", "a3-16d-rs-3.77MiB", "a3-16d-rs-8.76MiB"]
AG_8 = ["a3-8d-ag-3.5MiB"]
AIV_MESH_16 = ["a3-16d-ag-74KiB", "a3-16d-ag-278KiB", "a3-16d-ag-297KiB"]
AIV_FLOORS = {"allgather": "a3-8d-ag-1KiB", "reducescatter": "a3-8d-rs-14KiB", "allreduce": "a3-16d-ar-160KiB"}
AIV = {"HCCL_OP_EXPANSION_MODE": "AIV"}


def points() -> dict:
    with open(POINTS, encoding="utf-8") as f:
        return {p["id"]: p for p in yaml.safe_load(f) if p.get("preset") == "atlas900-a3"}


class Model:
    """atlas900-a3 with some constants replaced (the cached preset data, in this process)."""

    def __init__(self, pts):
        self.pts, self.data = pts, presets.preset_data("atlas900-a3")
        self.base = {"ub": self.data["superpod"]["bandwidth"], "port": self.data["superpod"]["port_bandwidth"],
                     "irb": self.data["device_model"]["inline_reduce_bandwidth"],
                     "ovh": dict(self.data["device_model"]["op_overhead"])}

    def seconds(self, pid, ub, port, irb, dispatch, ag, rs, aiv) -> float:
        p, d = self.pts[pid], self.data
        d["superpod"]["bandwidth"] = ub
        d["superpod"]["port_bandwidth"] = max(port, ub)
        d["device_model"]["inline_reduce_bandwidth"] = irb
        d["device_model"]["dispatch"] = dispatch
        d["device_model"]["op_overhead"] = dict(self.base["ovh"], allgather=ag, reducescatter=rs)
        d["device_model"]["aiv_op_overhead"] = dict(aiv)
        topo = topologies.hardware("atlas900-a3", devices_per_server=[p["npus"]])
        env = AIV if p["path"] == "AIV" else None
        return hccl_sim.simulate(p["op"], p["bytes"], topology=topo, dtype=p["dtype"], env=env).times[0]


def line(pts, ids, time):
    """(intercept s, per-die receive rate B/s) of a straight line through (bytes received per die, time)."""
    x = np.array([pts[i]["per_rank_bytes"] * (pts[i]["npus"] - 1) for i in ids], dtype=float)
    slope, intercept = np.polyfit(x, [time(i) for i in ids], 1)
    return intercept, 1 / slope


def main():
    pts = points()
    m = Model(pts)
    published = lambda i: pts[i]["figure"] * 1e-6          # noqa: E731 - the points' own figure
    const = {"ub": 100e9, "port": 0.0, "irb": 1e15, "dispatch": 0.0, "ag": 0.0, "rs": 0.0,
             "aiv": {"allgather": 0.0, "reducescatter": 0.0, "allreduce": 0.0}}

    def sim(i, **kw):
        c = dict(const, **kw)
        return m.seconds(i, c["ub"], c["port"], c["irb"], c["dispatch"], c["ag"], c["rs"], c["aiv"])

    # 1, 2: the model's rate rises with the link's (not quite in proportion: staging copies add
    # their own time per byte): scale the link to the published slope until they agree
    _, want = line(pts, AG_16, published)
    for _ in range(4):
        _, got = line(pts, AG_16, lambda i: sim(i))
        const["ub"] *= want / got
    _, want_rs = line(pts, RS_16, published)
    const["irb"] = const["ub"]
    for _ in range(4):
        _, got_rs = line(pts, RS_16, lambda i: sim(i))
        const["irb"] *= want_rs / got_rs
    # 3: dispatch and the AllGather call: linear in both (two equations, two unknowns)
    def gap(ids, **kw):
        return np.mean([published(i) - sim(i, **kw) for i in ids])
    h = 1e-6
    rows = [(AG_16, gap(AG_16)), (AG_8, gap(AG_8))]
    a = np.array([[(g - gap(ids, dispatch=h)) / h, (g - gap(ids, ag=h)) / h] for ids, g in rows])
    const["dispatch"], const["ag"] = np.linalg.solve(a, [g for _, g in rows])
    # 4: the ReduceScatter call, with that dispatch
    const["rs"] = gap(RS_16)
    # 5: each AIV kernel's call, from its floor (the links and dispatch do not enter an AIV call's fixed part)
    const["aiv"] = {op: gap([pid]) for op, pid in AIV_FLOORS.items()}
    # 6: the UB port, from the AIV mesh slope (linear in 1 / port rate: two trials give the line)
    _, want_mesh = line(pts, AIV_MESH_16, published)
    for _ in range(2):
        trials = [2 * const["ub"], 4 * const["ub"]]
        inv = [1 / line(pts, AIV_MESH_16, lambda i: sim(i, port=c))[1] for c in trials]
        a, b = np.polyfit([1 / c for c in trials], inv, 1)
        const["port"] = 1 / ((1 / want_mesh - b) / a)
        const["aiv"] = {op: gap([pid], aiv=dict.fromkeys(AIV_FLOORS, 0.0)) for op, pid in AIV_FLOORS.items()}
    print(f"UB per ring {const['ub'] / 1e9:.1f} GB/s (published one-loop AllGather slope {want / 1e9:.1f} GB/s per die)")
    print(f"UB port {const['port'] / 1e9:.1f} GB/s (published AIV mesh AllGather slope {want_mesh / 1e9:.1f} GB/s "
          f"received per die)")
    print(f"inline reduce {const['irb'] / 1e9:.1f} GB/s (published one-loop ReduceScatter slope {want_rs / 1e9:.1f})")
    print(f"dispatch {const['dispatch'] * 1e6:.2f} us per step; AllGather call {const['ag'] * 1e6:.1f} us; "
          f"ReduceScatter call {const['rs'] * 1e6:.1f} us")
    print("AIV calls: " + ", ".join(f"{op} {v * 1e6:.2f} us" for op, v in const["aiv"].items()))
    for i, p in pts.items():
        if p["regime"] == "large" or p["path"] == "AIV" or i in AIV_MESH_16:
            print(f"  {i:22s} published {p['figure']:8.1f} us  fitted {sim(i) * 1e6:8.1f} us  "
                  f"ratio {sim(i) / published(i):.3f}")


if __name__ == "__main__":
    main()
