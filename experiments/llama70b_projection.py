"""LLaMA-70B data-parallel gradient AllReduce at scale, projected with the timing engine, set
beside three claims of the articles this project started from: "35 GB per card", "about 40 % of
a step is communication", "hcomm zero-copy cuts the fixed latency to 10-15 us".

Model: 70e9 parameters, fp16 gradients = 140 GB per step, all-reduced once per step (no gradient
accumulation, no ZeRO). Two layouts:
- pure data parallelism: every card holds the whole model and all-reduces all 140 GB across
  every card of the cluster (HCCL's hierarchical algorithm, as selected);
- 8-way (910B) / 16-way (A3) model parallelism inside a server, data parallelism across servers:
  each card holds 1/k of the gradients and all-reduces them with the cards of the same position
  in the other servers (one rank per server; the k groups use k different NICs, so they do not
  share links and one group's time is the step's). Only the gradient AllReduce is counted: the
  model-parallel collectives of activations inside a server are not.
Per-card bytes on the wire are a ring AllReduce's 2(p-1)/p of what the card all-reduces.

Step compute (stated assumptions, change them on the command line): 6 x parameters FLOPs per
token (forward + backward), 4 Mi tokens per step (LLaMA 2's global batch), MFU 40 % of the
preset's peak (910B 320 TFLOPS FP16: a third-party figure, unverified; A3 376 TFLOPS BF16 per die:
half the vendor's 910C figure; docs/references.md §3.2, §3.3). The communication share is exposed
communication / (compute + exposed communication) with 0 %, 50 % and 90 % of the AllReduce
hidden under backward.

    python experiments/llama70b_projection.py [--tokens 4194304] [--mfu 0.4] [--out experiments/out]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hccl_sim                                   # noqa: E402
from topologies.subset import subset              # noqa: E402

PARAMS = 70e9
GRAD_BYTES = int(PARAMS * 2)                      # fp16
OVERLAPS = (0.0, 0.5, 0.9)
CLAIM_BYTES = 35e9
CLAIM_SHARE = 0.40
CLAIM_LATENCY_US = (10, 15)


def setups(quick: bool):
    b_servers = (16, 64, 128) if quick else (16, 64, 128, 512)
    for n in b_servers:
        yield ("910B", "DP", n, lambda n=n: hccl_sim.topology("atlas800t-a2", servers=n), 1)
    for n in b_servers:
        yield ("910B", "TP8 x DP", n, lambda n=n: hccl_sim.topology("atlas800t-a2", servers=n), 8)
    for pods, per in ((1, 8), (2, 16)):
        yield ("A3", "DP", pods * per, lambda pods=pods, per=per: hccl_sim.topology("atlas900-a3", superpods=pods,
                                                                                    servers=per), 1)
        yield ("A3", "TP16 x DP", pods * per, lambda pods=pods, per=per: hccl_sim.topology(
            "atlas900-a3", superpods=pods, servers=per), 16)


def project(args):
    rows = []
    for device, layout, servers, make, tp in setups(args.quick):
        topo = make()
        cards = topo.num_ranks
        group = topo if tp == 1 else subset(topo, list(range(0, cards, tp)))
        nbytes = GRAD_BYTES // tp
        t0 = time.perf_counter()
        est = hccl_sim.simulate("allreduce", nbytes, topology=group, dtype="float16")
        wall = time.perf_counter() - t0
        p = group.num_ranks
        wire = 2 * (p - 1) / p * nbytes
        peak = topo.device_model.peak_flops
        compute = 6 * PARAMS * args.tokens / (cards * peak * args.mfu)
        shares = [est.time * (1 - o) / (compute + est.time * (1 - o)) for o in OVERLAPS]
        rows.append(dict(device=device, layout=layout, servers=servers, cards=cards, group=p, nbytes=nbytes,
                         wire=wire, time=est.time, algo=est.algo, busbw=est.busbw, compute=compute, shares=shares,
                         wall=wall))
        print(f"  {device} {layout} {servers} servers: {est.time:.3f} s ({wall:.1f} s to simulate)", flush=True)
    return rows


def latency():
    out = []
    for name, kw in (("atlas800t-a2", dict(servers=1)), ("atlas800t-a2", dict(servers=2)),
                     ("atlas900-a3", dict(superpods=1, servers=1))):
        topo = hccl_sim.topology(name, **kw)
        est, plan = hccl_sim.simulate("allreduce", 8, topology=topo, trace=True)
        staging = sum(e[3] - e[2] for e in plan.events if e[0] == 0 and e[1].startswith("stage"))
        out.append((f"{name} x {topo.num_ranks}", est.time * 1e6, staging / 1e3, est.algo))
    return out


def table(rows, lat, args) -> str:
    gb = lambda b: f"{b / 1e9:.1f}"              # noqa: E731
    head = (f"| device | layout | servers | cards | AllReduce group | GB all-reduced per card | GB on the wire per card "
            f"(ring) | AllReduce time (s) | busbw (GB/s) | compute per step (s) | comm share, overlap "
            f"{' / '.join(f'{int(o * 100)} %' for o in OVERLAPS)} | algorithm |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['device']} | {r['layout']} | {r['servers']} | {r['cards']} | {r['group']} | "
                     f"{gb(r['nbytes'])} | {gb(r['wire'])} | {r['time']:.3f} | {r['busbw']:.1f} | {r['compute']:.2f} | "
                     + " / ".join(f"{100 * s:.0f} %" for s in r["shares"]) + f" | {r['algo']} |")
    lines += ["", "Small-message AllReduce (8 bytes) on the calibrated presets:", "",
              "| cluster | simulated (us) | of which staging copies (us) | algorithm |", "|---|---|---|---|"]
    for name, t, staging, algo in lat:
        lines.append(f"| {name} | {t:.1f} | {staging:.1f} | {algo} |")
    dp = [r for r in rows if r["layout"] == "DP"]
    tp = [r for r in rows if r["layout"] != "DP"]
    near = [r for r in rows if any(abs(s - CLAIM_SHARE) <= 0.1 for s in r["shares"])]
    lines += ["", "Against the claims:", "",
              f"- **35 GB per card**: pure data parallelism puts {min(r['wire'] for r in dp) / 1e9:.0f}-"
              f"{max(r['wire'] for r in dp) / 1e9:.0f} GB of gradients on each card's wire per step (2(p-1)/p x 140 GB); "
              f"with 8-way model parallelism inside a 910B server each card all-reduces 17.5 GB and sends "
              f"{min(r['wire'] for r in tp if r['device'] == '910B') / 1e9:.1f}-"
              f"{max(r['wire'] for r in tp if r['device'] == '910B') / 1e9:.1f} GB: the claim holds for that layout "
              "(the 140 GB split 8 ways, then a ring), not for pure data parallelism, which is 8x more.",
              f"- **about 40 % of a step** (at {args.tokens / 2**20:g} Mi tokens per step, MFU {100 * args.mfu:.0f} %): "
              + ("; ".join(f"{r['device']} {r['layout']} on {r['servers']} servers: "
                           + " / ".join(f"{100 * s:.0f} %" for s in r["shares"]) for r in near)
                 or "no setup here is within 10 points of 40 %")
              + " (overlap 0 / 50 / 90 %). The share grows with the cluster: compute per card shrinks as 1/cards "
              "while the AllReduce time does not, so 40 % is one point on a curve, set by tokens per step, MFU and "
              "overlap.",
              f"- **zero-copy fixed latency of 10-15 us**: the 910B preset is calibrated to the measured op-base "
              f"floor of hccl_test (22 us for a small AllReduce on 8 NPUs); its staging copies are "
              f"{lat[0][2]:.1f} us of that, so dropping them (zero-copy) gives about {lat[0][1] - lat[0][2]:.1f} us, not "
              "10-15 us: the claim needs the op's other fixed costs cut too, which no measurement in "
              "docs/references.md §4 shows (zero-copy is an A3, AI_CPU-mode trial feature, §6.7).",
              "", f"Regenerate: `python experiments/llama70b_projection.py --tokens {args.tokens} --mfu {args.mfu}`"]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4 * 2**20, help="tokens per step (default 4 Mi)")
    ap.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation (default 0.4)")
    ap.add_argument("--quick", action="store_true", help="skip the 512-server 910B rows")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    args = ap.parse_args(argv)
    rows = project(args)
    text = table(rows, latency(), args)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "llama70b_projection.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
