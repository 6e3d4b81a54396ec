"""The bench job (modelled on hccl_test / nccl-tests): a size sweep of one collective.

Each row (one size) runs the op in one of two ways:
- on real data (engines local, ray, mpi): every rank's input is verifiable (hccl_sim.collectives.verifiable),
  each timed iteration starts from aligned clocks (a barrier before it), and each rank counts its
  wrong elements against the expected result it computes alone;
- without payload (engine timing): hccl_sim.simulate prices the op; #wrong is N/A.

A row reports the simulated time per op (mean over ranks and iterations, as nccl-tests' default
`-a 1`), algbw and busbw with nccl-tests' factors (GB = 1e9 B), #wrong, the wall time one op took
to emulate (median over iterations of the slowest rank) and the algorithm that ran. Under a fault
plan it adds the op retries over the timed iterations and the time lost per op against the
fault-free twin. Output: nccl-tests' table, or hccl_test's columns (`--format hccl_test`), and
optionally JSON and a Chrome trace of one op per size (hccl_test's mode: hccl_sim.tools.hccl_test, its
inputs and check rule hccl_sim.tools.hccl_test_data). A sweep that would not finish or would not
fit in memory is refused before anything runs.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np

from topologies.errors import HcclError
from topologies.validate import integer, is_integer

from ..engines import registry
from .. import MAX_LOCAL_RANKS, busbw_factor, canonical_op, collectives, op_count, simulate
from ..npu import chrome_trace as chrome
from ..config.env import Config
from ..plan.faulted import with_faults
from ..config.types import dtype_name, nccl_name, numpy_dtype
from ..collectives import expected
from ..collectives.verifiable import rank_input
from . import hccl_test_data

REAL_ENGINES = tuple(n for n in registry.offering("bench") if registry.ENGINES[n].real_data)
ROOTED = tuple(n for n in collectives.DATA_COLLECTIVES if collectives.of(n).rooted)
REDUCING = tuple(n for n in collectives.DATA_COLLECTIVES + collectives.VARIABLE if collectives.of(n).reducing)


def parse_size(text: str) -> int:
    """'8', '1K', '64M', '1G' (binary multiples, as nccl-tests) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]{1,20})\s*([kKmMgGtT]?)[bB]?\s*", str(text))   # ASCII digits only
    if not m:
        raise HcclError("E_PARA", f"size {text!r} is not a byte count such as 8, 512K, 64M or 1G")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]


MAX_SIZES = 1000
"""Most rows one sweep may have (e.g. -b 0 -e 64M -i 1 would be 67 million ops): a bench finishes
in minutes or is refused before it starts."""
MAX_ITERS = 100_000
"""Most timed (-n) or warm-up (-w) iterations per size."""
HOST_MEMORY_FRACTION = 0.5
"""Share of this host's physical memory a real-data sweep (local/ray engine) may need for its
largest size: every rank holds an input, a result and the expected values."""


def sizes(minbytes: int, maxbytes: int, factor: int = 2, step: int = 0) -> list:
    """nccl-tests' size sweep: -b .. -e multiplying by -f (>= 2), or adding -i bytes (>= 1)."""
    if minbytes < 0 or maxbytes < minbytes:
        raise HcclError("E_PARA", f"size range {minbytes}..{maxbytes} is empty: need 0 <= -b <= -e")
    if step:
        if (maxbytes - minbytes) // step + 1 > MAX_SIZES:
            raise HcclError("E_PARA", f"-b {minbytes} -e {maxbytes} -i {step} makes {(maxbytes - minbytes) // step + 1} "
                            f"sizes; at most {MAX_SIZES} (hccl_sim.tools.bench.MAX_SIZES): use a larger -i or -f")
        return list(range(minbytes, maxbytes + 1, step))
    if not is_integer(factor) or factor < 2:
        raise HcclError("E_PARA", f"-f must be an integer multiplication factor >= 2 (or use -i to add bytes), "
                        f"got {factor!r}")
    out, s = [], minbytes
    while s <= maxbytes:
        out.append(s)
        s = s * factor if s else 1
    return out


@dataclass
class Row:
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None
    wall_us: float
    algo: str
    retries: int | None = None     # op retries over the timed iterations (under a fault plan)
    lost_us: float | None = None   # simulated time per op over the fault-free twin's (under a fault plan)
    rank_ns: tuple | None = None   # each rank's simulated time over the timed iterations (integer ns)
    rank_wrong: tuple | None = None   # each rank's wrong count (real data, checked)


@dataclass
class BenchSpec:
    op: str = "allreduce"
    sizes: list = field(default_factory=lambda: sizes(16, 64 << 20, 4))
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    algo: str | None = None
    engine: str = "local"
    iters: int = 5
    warmup: int = 1
    check: bool = True
    env: dict | None = None
    trace: str | None = None
    policy: str = "hccl"
    faults: object = None          # a hccl_sim.FaultPlan the sweep runs under
    ranks_per_process: int = 1     # engine mpi: ranks (threads) per MPI process
    data_plane: str | None = None  # a real engine's plane (README, "Engines"; the CLI's --data-plane: mpi's);
                                   # None: the engine's default. Once the sweep runs, the plane it runs on
    counts: object = None          # variable-size ops: how a send buffer splits among peers (collectives.splits;
                                   # None: uniform)
    check_rule: str = "verifiable"  # inputs and check: "verifiable" (nccl-tests' idea, collectives.verifiable)
                                   # or "hccl_test" (hccl_test's constants and comparisons, hccl_test_data)


def _matrix(spec, p: int, count: int):
    """A variable-size op's counts for a size of `count` elements, split as `--counts` says
    (Collective.counts_for; None for an op that takes no counts)."""
    from ..collectives.splits import parse
    return collectives.get(spec.op).counts_for(spec.counts or parse("uniform"), p, count)


def _simulate(spec, topo, count: int, itemsize: int, **kw):
    """simulate() of one row's op: by its bytes, or a variable-size op by its count matrix."""
    matrix = _matrix(spec, topo.num_ranks, count)
    size = {"counts": matrix} if matrix is not None else {"nbytes": count * itemsize}
    return simulate(spec.op, topology=topo, algo=spec.algo, dtype=spec.dtype, redop=spec.redop, root=spec.root,
                    env=spec.env, policy=spec.policy, **size, **kw)


def run_bench(spec: BenchSpec, topo, progress=None) -> list:
    """Run the sweep; returns Rows (and calls `progress(row)` as each completes)."""
    spec.op = canonical_op(spec.op)
    spec.dtype = dtype_name(spec.dtype)
    p = topo.num_ranks
    itemsize = numpy_dtype(spec.dtype).itemsize
    rows = []
    trace_sections = []
    config = Config.from_env(spec.env, spec.policy)   # validates the environment before anything runs
    config = with_faults(topo, config, spec.faults)   # checks a fault plan against the topology first
    check_spec(spec, p)

    def clean_time_s(count):
        """The fault-free twin's time per op (mean over ranks): timing is shift-invariant, so one
        payload-free replay from aligned clocks is every fault-free iteration's."""
        est = _simulate(spec, topo, count, itemsize)
        return sum(round(t * 1e9) for t in est.times) / p / 1e9

    def emit(size, count, time_s, wrong, wall_s, algo, retries=None, rank_ns=None, rank_wrong=None):
        nbytes = count * itemsize
        algbw = nbytes / time_s / 1e9 if time_s > 0 else 0.0
        lost = None if spec.faults is None else (time_s - clean_time_s(count)) * 1e6
        row = Row(size=nbytes, count=count, dtype=nccl_name(spec.dtype),
                  redop=spec.redop if spec.op in REDUCING else "none",
                  root=spec.root if spec.op in ROOTED else -1, time_us=time_s * 1e6, algbw=algbw,
                  busbw=algbw * busbw_factor(spec.op, p), wrong=wrong, wall_us=wall_s * 1e6, algo=algo,
                  retries=None if spec.faults is None else int(retries or 0), lost_us=lost,
                  rank_ns=None if rank_ns is None else tuple(rank_ns),
                  rank_wrong=None if rank_wrong is None else tuple(rank_wrong))
        rows.append(row)
        if progress:
            progress(row)

    for size in spec.sizes:
        count = op_count(spec.op, size, p, itemsize)
        if spec.trace:
            est, plan = _simulate(spec, topo, count, itemsize, trace=True, faults=spec.faults)
            trace_sections.append((f"{spec.op} {count * itemsize} B ({plan.algo})", plan.events or []))
        if not _engine(spec).real_data:
            t0 = time.perf_counter()
            est = _simulate(spec, topo, count, itemsize, faults=spec.faults)
            per_rank = [round(t * 1e9) for t in est.times]
            emit(size, count, sum(per_rank) / p / 1e9, None, time.perf_counter() - t0, est.algo, est.retries,
                 rank_ns=[t * spec.iters for t in per_rank])
    if _engine(spec).real_data:
        _run_sweep(spec, topo, config, emit)
    if spec.trace:
        chrome.write(spec.trace, trace_sections)
    return rows


def check_spec(spec: BenchSpec, p: int) -> None:
    """Refuse, before anything runs, a sweep that would not finish or would not fit in memory."""
    for flag, value, lo in (("-n", spec.iters, 1), ("-w", spec.warmup, 0)):
        integer(value, f"{flag} (iterations)", lo, MAX_ITERS, limit="hccl_sim.tools.bench.MAX_ITERS")
    if not spec.sizes or len(spec.sizes) > MAX_SIZES:
        raise HcclError("E_PARA", f"a sweep has 1 to {MAX_SIZES} sizes (hccl_sim.tools.bench.MAX_SIZES), got {len(spec.sizes)}")
    for size in spec.sizes:
        integer(size, "size", 0, where="bench")
    engine = _engine(spec)
    _check_local_size_of(p, engine)
    if spec.counts is not None and _matrix(spec, p, p) is None:       # an op that takes no counts
        raise HcclError("E_PARA", f"--counts is for the variable-size ops ({', '.join(collectives.VARIABLE)}), "
                        f"not {spec.op}")
    problem = collectives.get(spec.op).priced_ranks_problem(p)
    if not engine.real_data and problem:
        raise HcclError("E_PARA", f"bench {canonical_op(spec.op)} on engine timing: {problem}")
    limit = collectives.get(spec.op).max_ranks_with_data
    if engine.real_data and limit is not None and p > limit:
        raise HcclError("E_PARA", f"bench {spec.op} on engine {spec.engine}: {p} ranks are over the limit of "
                        f"{limit} for real data (collectives max_ranks_with_data); use --engine timing")
    if engine.real_data:
        need = 3 * p * max(spec.sizes)
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if need > HOST_MEMORY_FRACTION * have:
            raise HcclError("E_MEMORY", f"bench on engine {spec.engine}: {p} ranks x {max(spec.sizes)} B of real data "
                            f"need about {need / 2**30:.1f} GiB, over {HOST_MEMORY_FRACTION:.0%} of this host's "
                            f"{have / 2**30:.1f} GiB (hccl_sim.tools.bench.HOST_MEMORY_FRACTION); use --engine timing")


def _engine(spec):
    return registry.get(spec.engine, "bench", "--engine")


def _check_local_size_of(p: int, engine) -> None:
    if engine.in_process and p > MAX_LOCAL_RANKS:
        raise HcclError("E_PARA", f"bench on engine local: {p} ranks are over the limit of {MAX_LOCAL_RANKS} "
                        "(hccl_sim.MAX_LOCAL_RANKS, one thread per rank); use --engine timing")


def _sweep(comm, spec, emit=None):
    """Runs on every rank: the whole sweep, so ranks live across rows. Rank 0 reports each row
    through `emit` (in-process engines) or returns them all (actors)."""
    p = comm.size
    itemsize = numpy_dtype(spec.dtype).itemsize
    call = getattr(comm, collectives.of(spec.op).method)
    rank = comm.rank
    kwargs = {"algo": spec.algo}
    if spec.op in REDUCING:
        kwargs["op"] = spec.redop
    if spec.op in ROOTED:
        kwargs["root"] = spec.root
    rows = []
    for size in spec.sizes:
        count = op_count(spec.op, size, p, itemsize)
        per_rank = collectives.of(spec.op).input_shape_for_bytes(count * itemsize, p, itemsize)[0]
        hccl_test = spec.check_rule == "hccl_test"
        matrix = _matrix(spec, p, count)
        if matrix is not None:            # a variable-size op: its counts are its arguments
            coll = collectives.get(spec.op)
            per_rank = coll.input_rows(matrix, rank)
            call = _bound(getattr(comm, coll.method), coll.call_counts(matrix, rank))
        x = (hccl_test_data.inputs(spec.op, rank, p, per_rank, spec.dtype, spec.redop, spec.root) if hccl_test
             else rank_input(rank, per_rank, spec.dtype, spec.redop))
        for _ in range(spec.warmup):
            call(x, **kwargs)
        sim, wall = [], []
        retries = 0
        y = None
        for _ in range(spec.iters):
            if comm.last_op is not None:    # aligns clocks: each op is timed from a common start
                comm.barrier()              # (the job's first op starts at 0 everywhere, as simulate's)
            t0 = time.perf_counter()
            y = call(x, **kwargs)
            wall.append(time.perf_counter() - t0)
            sim.append(comm.last_op.end - comm.last_op.start)      # integer ns
            retries += comm.last_op.retries
        algo = comm.last_op.algo if spec.iters else ""
        wrong = -1.0
        if spec.check and spec.iters and hccl_test:
            n_out = y.size if y is not None else 0
            want = hccl_test_data.expected(spec.op, rank, p, n_out, spec.dtype, spec.redop, spec.root)
            wrong = float(hccl_test_data.wrong(spec.op, spec.dtype, y, want, p)[0])
        elif spec.check and spec.iters:
            want = (expected(spec.op, rank, p, per_rank, spec.dtype, spec.redop, spec.root) if matrix is None
                    else collectives.get(spec.op).verifiable_v(matrix, rank, spec.dtype, spec.redop))
            wrong = 0.0 if want is None else float(np.count_nonzero(y.reshape(-1) != want))
        stats = np.array([wrong, float(sum(sim)) if sim else 0.0] + wall, dtype=np.float64)
        gathered = comm.all_gather(stats).reshape(p, -1)
        if rank == 0:
            wrongs = gathered[:, 0]
            walls = gathered[:, 2:].max(axis=0) if spec.iters else np.zeros(1)
            total_ns = int(gathered[:, 1].sum())                   # exact: sums of integers < 2^53
            row = (size, count, total_ns / (p * max(spec.iters, 1)) / 1e9,
                   None if wrongs[0] < 0 else int(wrongs.sum()), float(np.median(walls)), algo, retries,
                   [int(t) for t in gathered[:, 1]], None if wrongs[0] < 0 else [int(w) for w in wrongs])
            if emit is not None:
                emit(*row)
            rows.append(row)
    return rows


def _bound(method, counts):
    def call(x, **kwargs):
        return method(x, *counts, **kwargs)
    return call


def _run_sweep(spec, topo, config, emit):
    """The sweep on a real engine; `spec.data_plane` becomes the plane it runs on (the header's)."""
    engine = _engine(spec)
    if engine.in_process:          # ranks emit their rows as they complete
        spec.data_plane = spec.data_plane or engine.data_planes[0]
        engine.launch(_sweep, topo, config, (spec, emit), None, data_plane=spec.data_plane)
        return
    if engine.spmd:
        # every process runs the sweep; rank 0 (thread 0 of process 0) emits each row as it completes
        from ..engines.mpi import default_plane, world
        if spec.data_plane is None:              # collective: every process runs the sweep
            spec.data_plane = default_plane(world())
        engine.launch(_sweep, topo, config, (spec, emit), None, data_plane=spec.data_plane,
                      ranks_per_process=None if spec.ranks_per_process == 1 else spec.ranks_per_process)
        return
    from .. import Cluster
    with Cluster(topo, engine="ray", env=spec.env, policy=spec.policy, faults=spec.faults,
                 data_plane=spec.data_plane) as cluster:
        spec.data_plane = cluster.data_plane     # chosen from where the actors landed
        for row in cluster.run(_sweep, args=(spec,))[0]:
            emit(*row)


# ---- formatting ---------------------------------------------------------------------------------

def header(spec: BenchSpec, topo) -> str:
    p = topo.num_ranks
    faulty = spec.faults is not None
    lines = [f"# hccl-sim bench: {spec.op} on {topo.name} ({topo.num_servers} server{'s' if topo.num_servers > 1 else ''}, "
             f"{p} ranks, {topo.device}), engine {spec.engine}"
             + (f", data plane {spec.data_plane}" if spec.data_plane and spec.engine in REAL_ENGINES else ""),
             f"# minBytes {min(spec.sizes)} maxBytes {max(spec.sizes)} sizes: {len(spec.sizes)} warmup iters: "
             f"{spec.warmup} iters: {spec.iters} validation: {int(spec.check and spec.engine in REAL_ENGINES)} "
             f"policy: {spec.policy}",
             "# time is simulated time per op on the modelled cluster (mean over ranks); wall is the real time "
             "one op took to emulate here",
             "#",
             f"# {'':>10s} {'':>12s} {'':>8s} {'':>6s} {'':>6s} {'simulated':>24s}",
             f"# {'size':>10s} {'count':>12s} {'type':>8s} {'redop':>6s} {'root':>6s} {'time':>9s} {'algbw':>7s} "
             f"{'busbw':>7s} {'#wrong':>6s} {'wall':>9s}" + (f" {'retries':>7s} {'lost':>9s}" if faulty else "")
             + "  algo",
             f"# {'(B)':>10s} {'(elements)':>12s} {'':>8s} {'':>6s} {'':>6s} {'(us)':>9s} {'(GB/s)':>7s} "
             f"{'(GB/s)':>7s} {'':>6s} {'(us)':>9s}" + (f" {'':>7s} {'(us)':>9s}" if faulty else "")]
    if faulty:
        lines.insert(3, f"# under fault plan (seed {spec.faults.seed}, {len(spec.faults)} fault(s)): retries over the "
                        "timed iterations, lost = simulated time per op over the fault-free twin's")
    return "\n".join(lines)


def _time(us: float) -> str:
    return f"{us:9.2f}" if us < 1e6 else f"{us:9.0f}"


def format_row(row: Row) -> str:
    wrong = "N/A" if row.wrong is None else str(row.wrong)
    faults = "" if row.retries is None else f" {row.retries:7d} {_time(row.lost_us)}"
    return (f"{row.size:12d} {row.count:12d} {row.dtype:>8s} {row.redop:>6s} {row.root:6d} {_time(row.time_us)} "
            f"{row.algbw:7.2f} {row.busbw:7.2f} {wrong:>6s} {_time(row.wall_us)}{faults}  {row.algo}")


def footer(rows: list) -> str:
    wrong = sum(r.wrong or 0 for r in rows)
    avg = sum(r.busbw for r in rows) / len(rows) if rows else 0.0
    return "\n".join([f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
                      f"# Avg bus bandwidth    : {avg:g}", "#"])


def to_json(spec: BenchSpec, topo, rows: list) -> dict:
    wrong = sum(r.wrong or 0 for r in rows)
    return {
        "op": spec.op, "topology": topo.name, "ranks": topo.num_ranks, "servers": topo.num_servers,
        "engine": spec.engine, **({"data_plane": spec.data_plane} if spec.engine in REAL_ENGINES else {}),
        "dtype": spec.dtype, "iters": spec.iters, "warmup": spec.warmup,
        "rows": [{"size": r.size, "count": r.count, "type": r.dtype, "redop": r.redop, "root": r.root,
                  "time": r.time_us, "alg_bw": r.algbw, "bus_bw": r.busbw, "nwrong": r.wrong,
                  "wall_time": r.wall_us, "algo": r.algo,
                  **({} if r.retries is None else {"retries": r.retries, "lost_time": r.lost_us})} for r in rows],
        "out_of_bounds": {"count": wrong, "okay": wrong == 0},
        "average_bus_bandwidth": {"bandwidth": sum(r.busbw for r in rows) / len(rows) if rows else 0.0},
    }


def write_json(path: str, spec, topo, rows) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_json(spec, topo, rows), f, indent=2)
