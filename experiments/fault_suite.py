"""Fault suites of the user's own code (hccl_sim.testing), measured on the example project
(examples/fault_suite): scenarios per second at 8 and 16 ranks on the local engine, the buggy
sync's time to its first failure and to the shrunk plan, and its replay token reproducing the
failure bit for bit on local and Ray; with --ray, also a whole seed's scenarios on local and on
Ray side by side (the same plans, the same outcomes and details).

    python experiments/fault_suite.py [--n 200] [--seeds 3] [--ray [--ray-n 60]]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "fault_suite"))

import hccl_sim  # noqa: E402
from hccl_sim.testing import explore, replay  # noqa: E402
from topologies import hardware  # noqa: E402

import grad_sync  # noqa: E402


def body_for(sync, topo, cluster=None):
    def body():
        if cluster is not None:
            weights = cluster.run(grad_sync.train, args=(sync,), env=grad_sync.ENV)
        else:
            weights = hccl_sim.run(grad_sync.train, topology=topo, env=grad_sync.ENV, args=(sync,))
        assert all((w == weights[0]).all() for w in weights)
    return body


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="also replay the shrunk failure on Ray")
    ap.add_argument("--ray-n", type=int, default=60, help="scenarios of the seed compared on local and Ray")
    a = ap.parse_args()
    import logging
    logging.getLogger("grad_sync").setLevel(logging.ERROR)
    print("| ranks | seed | scenarios | wall s | scenarios/s | recovered | clean error | WRONG/HANG/LEAK |")
    print("|---|---|---|---|---|---|---|---|")
    for servers in (2, 4):
        topo = hardware("atlas800t-a2", devices_per_server=[4] * servers)
        rates = []
        for seed in range(a.seeds):
            rep = explore(body_for(grad_sync.sync_with_retries, topo), "retries", n=a.n, seed=seed)
            c = rep.counts()
            rate = len(rep.scenarios) / (rep.wall_s - rep.twin_s)
            rates.append(rate)
            print(f"| {topo.num_ranks} | {seed} | {len(rep.scenarios)} | {rep.wall_s:.1f} | {rate:.1f} | "
                  f"{c['recovered']} | {c['clean error']} | {c['WRONG']}/{c['HANG']}/{c['LEAK']} |")
        print(f"median scenarios/s at {topo.num_ranks} ranks: {statistics.median(rates):.1f}")
    print()
    print("| seed | first failure at scenario | its wall s | shrink runs | shrink s | shrunk plan | outcome |")
    print("|---|---|---|---|---|---|---|")
    topo = grad_sync.TOPOLOGY
    tokens = []
    for seed in range(a.seeds):
        t0 = time.perf_counter()
        rep = explore(body_for(grad_sync.sync_or_local, topo), "buggy", n=a.n, seed=seed)
        first_s = sum(s.wall_s for s in rep.scenarios) + rep.twin_s
        print(f"| {seed} | {len(rep.scenarios) - 1} | {first_s:.2f} | {rep.shrink_runs} | {rep.shrink_s:.2f} | "
              f"{rep.shrunk.words} | {rep.shrunk.outcome} |")
        tokens.append((rep.token, rep.shrunk))
        del t0
    print()
    for token, shrunk in tokens:
        again = replay(body_for(grad_sync.sync_or_local, topo), token, "buggy")
        same_local = (again.outcome, again.verdict.detail) == (shrunk.outcome, shrunk.verdict.detail)
        line = f"replay {token[:24]}...: local {again.outcome} ({'identical' if same_local else 'DIFFERS'})"
        if a.ray:
            import ray.cloudpickle
            ray.cloudpickle.register_pickle_by_value(grad_sync)
            with hccl_sim.Cluster(topo, engine="ray") as cluster:
                on_ray = replay(body_for(grad_sync.sync_or_local, topo, cluster), token, "buggy")
            same_ray = (on_ray.outcome, on_ray.verdict.detail) == (shrunk.outcome, shrunk.verdict.detail)
            line += f", ray {on_ray.outcome} ({'identical' if same_ray else 'DIFFERS'})"
        print(line)
    if a.ray:
        same_seed_on_ray(a.ray_n)


def same_seed_on_ray(n, seed=11):
    """One seed's scenarios of the correct sync on the local engine and on a Ray cluster: plan by
    plan, outcome and detail."""
    import ray.cloudpickle
    ray.cloudpickle.register_pickle_by_value(grad_sync)
    topo = grad_sync.TOPOLOGY
    local = explore(body_for(grad_sync.sync_with_retries, topo), "retries", n=n, seed=seed)
    with hccl_sim.Cluster(topo, engine="ray") as cluster:
        on_ray = explore(body_for(grad_sync.sync_with_retries, topo, cluster), "retries", n=n, seed=seed)
    plans = sum(x.plan.to_dict() == y.plan.to_dict() for x, y in zip(local.scenarios, on_ray.scenarios))
    outcomes = sum((x.outcome, x.verdict.detail) == (y.outcome, y.verdict.detail)
                   for x, y in zip(local.scenarios, on_ray.scenarios))
    print()
    print(f"seed {seed}, {n} scenarios of the correct sync: local {local.summary().split(': ', 1)[1]} in "
          f"{local.wall_s:.1f} s; ray {on_ray.summary().split(': ', 1)[1]} in {on_ray.wall_s:.1f} s")
    print(f"same plans {plans}/{len(local.scenarios)}, same outcome and detail {outcomes}/{len(local.scenarios)}")
    for x, y in zip(local.scenarios, on_ray.scenarios):
        if (x.outcome, x.verdict.detail) != (y.outcome, y.verdict.detail):
            print(f"  differs: {x.words}: local {x.outcome} {x.verdict.detail[:100]} | ray {y.outcome} "
                  f"{y.verdict.detail[:100]}")


if __name__ == "__main__":
    main()
