"""A torch script's fault suite (hccl_sim.torch.launch under hccl_sim.testing), measured on the example
examples/torch_fault_suite/train_ddp.py (DDP, 4 ranks, 4 steps): outcomes and wall time per scenario
under torchrun (elastic restarts from a checkpoint) and on Ray (no restarts: a crash is a clean
error), and the buggy checkpoint's time to its first failure and its shrunk plan.

    python experiments/torch_fault_suite.py [--n 50] [--seed 0] [--engines torchrun ray]
"""
import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "examples" / "torch_fault_suite"
sys.path.insert(0, str(HERE))

import hccl_sim  # noqa: E402
import hccl_sim.torch as ht  # noqa: E402
from hccl_sim.testing import explore  # noqa: E402
from topologies import presets  # noqa: E402

from test_train_ddp import ENV, KINDS, SCRIPT, close_to_the_twin  # noqa: E402


def body(engine, ckpt, extra=(), cluster=None):
    def run():
        if engine == "ray":
            return ht.launch(SCRIPT, 4, list(extra), engine="ray", cluster=cluster, env=ENV)
        return ht.launch(SCRIPT, 4, ["--checkpoint-dir", ckpt, *extra], max_restarts=1, env=ENV)
    return run


def line(engine, rep):
    walls = [s.wall_s for s in rep.scenarios]
    c = rep.counts()
    print(f"| {engine} | {len(rep.scenarios)} | {c['recovered']} | {c['clean error']} | {c['WRONG']}/{c['HANG']}/"
          f"{c['LEAK']} | {rep.twin_s:.1f} | {statistics.median(walls):.1f} | {min(walls):.1f}-{max(walls):.1f} | "
          f"{rep.wall_s:.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engines", nargs="+", default=["torchrun", "ray"])
    a = ap.parse_args()
    ckpt = tempfile.mkdtemp(prefix="hccl-sim-ckpt-")
    print("| engine | scenarios | recovered | clean error | WRONG/HANG/LEAK | twin s | median s per scenario | "
          "range s | total s |")
    print("|---|---|---|---|---|---|---|---|---|")
    kinds = {}
    for engine in a.engines:
        cluster = hccl_sim.Cluster(presets.filled("atlas800t-a2", 4), engine="ray") if engine == "ray" else None
        try:
            rep = explore(body(engine, ckpt, cluster=cluster), f"ddp-{engine}", n=a.n, seed=a.seed, kinds=KINDS,
                          max_faults=1, check=close_to_the_twin, deadline_s=120)
        finally:
            if cluster is not None:
                cluster.close()
        line(engine, rep)
        kinds[engine] = rep
        if rep.failed:
            print(f"  failure: {rep.failure.words}: {rep.failure.verdict.detail[:300]}")
    for engine, rep in kinds.items():
        by_kind = {}
        for s in rep.scenarios:
            k = s.plan.entries[0]["kind"]
            by_kind.setdefault(k, {}).setdefault(s.outcome, 0)
            by_kind[k][s.outcome] += 1
        print(f"{engine} by kind: " + "; ".join(f"{k}: " + ", ".join(f"{n} {o}" for o, n in v.items())
                                                for k, v in sorted(by_kind.items())))
    print()
    rep = explore(body("torchrun", ckpt, ["--model-only"]), "ddp-model-only", n=a.n, seed=a.seed, kinds=KINDS,
                  max_faults=1, check=close_to_the_twin, deadline_s=120)
    first = rep.twin_s + sum(s.wall_s for s in rep.scenarios)
    if rep.failure is None:
        print(f"model-only checkpoint: no failure in {len(rep.scenarios)} scenarios")
        return
    print(f"model-only checkpoint (torchrun): first failure at scenario {len(rep.scenarios) - 1} after {first:.0f} s "
          f"({rep.failure.words}); shrunk in {rep.shrink_runs} runs, {rep.shrink_s:.0f} s, to {rep.shrunk.words}: "
          f"{rep.shrunk.outcome}: {rep.shrunk.verdict.detail[:200]}")
    print(f"replay token {rep.token}")


if __name__ == "__main__":
    main()
