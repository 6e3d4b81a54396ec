"""Record (or compare) `hccl_sim.simulate` times over a broad grid, to prove that a change to the
timing engine's speed leaves every simulated nanosecond where it was.

Grid: every collective x algorithm (HCCL's choice and every token) x rank counts 1..16, 24, 64,
100 on the synthetic fullmesh and ring presets, plus Atlas 800T A2 (1, 2, 3 servers) and Atlas 800
(1, 2 servers), at sizes 1, 7, 1000, 2**20+3, 2**30 bytes; a few extra cases vary the root, dtype,
reduce op, HCCL_BUFFSIZE and policy. Each case records est.algo, est.time and every rank's time,
or the error's code and message.

    python experiments/time_identity.py record base.json      # at the base commit
    python experiments/time_identity.py compare base.json     # after a change: zero differences

`--large` runs the other grid instead: thousands of ranks, where the timing engine prices groups
that repeat (servers, superpods, same-index cards) once, so each case records every rank's time
as one digest. Atlas 800T A2 on 129, 1,024 and 2,048 servers (every op x HCCL's choice, ring,
H-D_R, NHR, NB, pipeline), Atlas 900 A3 on 2-16 superpods (equal and unequal), Atlas 800 on 64
servers, flat ring and full mesh presets at 2,048-4,096 ranks, and stragglers (entries that differ
by rank, so the groups do not start together). A few minutes on two cores.

    python experiments/time_identity.py record large.json --large
    python experiments/time_identity.py compare large.json --large
"""
import hashlib
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


def large_cases():
    """Thousands of ranks: every rank's time is kept as a digest (`--large`)."""
    for servers in (129, 1024):
        for op in OPS[:5]:
            for algo in (None, "ring", "H-D_R", "NHR", "NB", "pipeline"):
                for size in (2 ** 30 + 13, 10 ** 6 + 7):
                    yield ("atlas800t-a2", {"servers": servers}, op, algo, size, {})
    for op in OPS[:5]:
        for size in (2 ** 30, 10 ** 9):
            yield ("atlas800t-a2", {"servers": 2048}, op, None, size, {})
        yield ("atlas800-910a", {"servers": 64}, op, None, 10 ** 9, {})
        for kw in ({"superpods": 2, "servers": 8}, {"superpods": 4, "servers": 48}, {"superpods": 16, "servers": 8},
                   {"superpods": 3, "servers": [6, 4, 2]}, {"superpods": 1, "servers": 96}):
            for algo in (None, "ring", "NHR", "H-D_R"):
                yield ("atlas900-a3", kw, op, algo, 2 ** 30 + 13, {})
    for name, ranks in (("ring", 4096), ("fullmesh", 2048)):
        for algo in ("ring", "NHR", "H-D_R", "NB"):
            yield (name, {"ranks": ranks}, "allreduce", algo, 10 ** 9, {})
    # entries that differ by rank: a straggling card on the first server and one far away
    for op in OPS[:5]:
        for topo, kw, far in (("atlas800t-a2", {"servers": 1024}, 4000), ("atlas900-a3", {"superpods": 4, "servers": 8}, 400)):
            yield (topo, kw, op, None, 2 ** 30 + 13, {"stragglers": [[5, 3e-5], [far, 1e-4]]})


def run_case(case, digest=False):
    import logging
    import hccl_sim
    logging.disable(logging.WARNING)
    name, kw, op, algo, size, extra = case
    key = json.dumps([name, kw, op, algo, size, extra], sort_keys=True)
    extra = dict(extra)
    stragglers = extra.pop("stragglers", None)
    if stragglers:
        extra["faults"] = hccl_sim.FaultPlan(seed=0)
        for rank, delay in stragglers:
            extra["faults"].straggler(rank, delay)
    try:
        topo = hccl_sim.topology(name, **kw) if name in ("atlas800t-a2", "atlas800-910a", "atlas900-a3") else \
            hccl_sim.topology(name, bandwidth=25e9, latency=5e-6, **kw)
        est = hccl_sim.simulate(op, size, topology=topo, algo=algo, **extra)
        ranks = list(est.times)
        if digest:
            ranks = hashlib.sha1(json.dumps(ranks).encode()).hexdigest()
        return key, {"algo": est.algo, "time": est.time, "ranks": ranks}
    except hccl_sim.HcclError as e:
        return key, {"error": e.code, "message": str(e)}


def run_large_case(case):
    return run_case(case, digest=True)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    large = "--large" in sys.argv[3:]
    # fresh workers now and then: cost models cached across cases would pile up
    with Pool(2, maxtasksperchild=10 if large else 100) as pool:
        if large:
            got = dict(pool.imap_unordered(run_large_case, list(large_cases()), chunksize=1))
        else:
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
