"""Record (or compare) `hccl_sim.simulate` times over a broad grid, to prove that a change to the
timing engine's speed leaves every simulated nanosecond where it was.

Grid: every collective x algorithm (HCCL's choice and every token) x rank counts 1..16, 24, 64,
100 on the synthetic fullmesh and ring presets, plus Atlas 800T A2 (1, 2, 3 servers) and Atlas 800
(1, 2 servers), at sizes 1, 7, 1000, 2**20+3, 2**30 bytes; a few extra cases vary the root, dtype,
reduce op, HCCL_BUFFSIZE and policy. Each case records est.algo, est.time and every rank's time,
or the error's code and message.

    python experiments/time_identity.py record base.json      # at the base commit
    python experiments/time_identity.py compare base.json     # after a change: zero differences
"""
import json
import sys
from multiprocessing import Pool

OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")
ALGOS = (None, "ring", "H-D_R", "NHR", "NB", "fullmesh", "pipeline", "pairwise", "star")
SIZES = (1, 7, 1000, 2 ** 20 + 3, 2 ** 30)
RANKS = tuple(range(1, 17)) + (24, 64, 100)


def topologies():
    out = [("fullmesh", {"ranks": n}) for n in RANKS] + [("ring", {"ranks": n}) for n in RANKS]
    out += [("atlas800t-a2", {"servers": s}) for s in (1, 2, 3)]
    out += [("atlas800-910a", {"servers": s}) for s in (1, 2)]
    return out


def cases():
    for name, kw in topologies():
        for op in OPS:
            for algo in ALGOS:
                for size in SIZES:
                    yield (name, kw, op, algo, size, {})
        p = kw.get("ranks", 8 * kw.get("servers", 1))
        extras = [("broadcast", {"root": p - 1}), ("reduce", {"root": p // 2}),
                  ("allreduce", {"dtype": "float16", "redop": "max"}), ("allreduce", {"dtype": "int8"}),
                  ("allreduce", {"env": {"HCCL_BUFFSIZE": "1"}}), ("reducescatter", {"env": {"HCCL_BUFFSIZE": "1"}}),
                  ("allgather", {"policy": "model"}), ("allreduce", {"policy": "model"})]
        for op, extra in extras:
            for size in (1000, 2 ** 20 + 3, 2 ** 27 + 5):
                yield (name, kw, op, None, size, extra)
    # larger and uneven: where the engine's shortcuts (symmetry, chunk classes, loops) matter
    # (a full mesh schedule on a 1,000-rank ring topology routes 10^6 multi-hop transfers: minutes)
    big = [("ring", {"ranks": n}, ALGOS[:5]) for n in (1000, 1024)] + [("fullmesh", {"ranks": 300}, ALGOS[:7])]
    big += [("atlas800t-a2", {"servers": s}, ALGOS[:7]) for s in (4, 5, 16, 37, 64, 100)]
    big += [("atlas800-910a", {"servers": s}, ALGOS[:7]) for s in (3, 5, 16)]
    for name, kw, algos in big:
        for op in OPS[:5]:
            for algo in algos:
                for size in (10 ** 9, 2 ** 30 + 13, 2 ** 24 + 1):
                    yield (name, kw, op, algo, size, {})


def run_case(case):
    import logging
    import hccl_sim
    logging.disable(logging.WARNING)
    name, kw, op, algo, size, extra = case
    key = json.dumps([name, kw, op, algo, size, extra], sort_keys=True)
    try:
        topo = hccl_sim.topology(name, **kw) if name in ("atlas800t-a2", "atlas800-910a") else \
            hccl_sim.topology(name, bandwidth=25e9, latency=5e-6, **kw)
        est = hccl_sim.simulate(op, size, topology=topo, algo=algo, **extra)
        return key, {"algo": est.algo, "time": est.time, "ranks": list(est.times)}
    except hccl_sim.HcclError as e:
        return key, {"error": e.code, "message": str(e)}


def main():
    mode, path = sys.argv[1], sys.argv[2]
    # fresh workers now and then: cost models cached across cases would pile up
    with Pool(2, maxtasksperchild=100) as pool:
        got = dict(pool.imap_unordered(run_case, list(cases()), chunksize=4))
    if mode == "record":
        with open(path, "w") as f:
            json.dump(got, f)
        print(f"recorded {len(got)} cases ({sum('error' in v for v in got.values())} errors) in {path}")
        return
    with open(path) as f:
        base = json.load(f)
    diff = [k for k in base.keys() | got.keys() if base.get(k) != got.get(k)]
    for k in sorted(diff)[:20]:
        print("DIFF", k, "\n  base", str(base.get(k))[:300], "\n  now ", str(got.get(k))[:300])
    where = {}
    for k in diff:                             # which topologies moved: a change should name its presets
        name, params = json.loads(k)[:2]
        where[(name, json.dumps(params))] = where.get((name, json.dumps(params)), 0) + 1
    for (name, params), n in sorted(where.items()):
        print(f"  {n:5d} differences on {name} {params}")
    print(f"{len(got)} cases, {len(diff)} differences")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
