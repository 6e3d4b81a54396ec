"""The `hccl-sim` command: `bench` (the main job), `topo`, `chaos` (seeded fault campaigns) and
`train` (data-parallel training, hccl_sim.training.command).

Bad arguments end in a one-line error and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import warnings

import topologies
from topologies.errors import HcclError

from .. import OPS, __version__
from ..collectives import VARIABLE
from .bench import write_json
from ..engines import registry
from ..faults.fault_plan import FaultPlan
from ..config.types import DTYPES

DEFAULT_TOPOLOGY = "atlas800t-a2"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SystemExit(_fail(f"{self.prog}: {message} (see --help)"))


def _fail(message: str) -> int:
    print(f"hccl-sim: error: {message}", file=sys.stderr)
    return 2


def _topology(args):
    params = {}
    name = args.topology
    lname = topologies.ALIASES.get(name.lower(), name.lower())
    if lname in topologies.SYNTHETIC_PRESETS:
        if args.ranks is None:
            raise HcclError("E_PARA", f"--topology {name} needs --ranks N")
        params["ranks"] = args.ranks
        for key in ("bandwidth", "latency", "reduce_bandwidth"):
            value = getattr(args, key, None)
            if value is not None:
                params[key] = value
        if args.servers is not None:
            raise HcclError("E_PARA", f"--servers does not apply to the synthetic topology {name}; use --ranks")
    elif lname in topologies.HARDWARE_PRESETS:
        if args.ranks is not None:
            raise HcclError("E_PARA", f"--ranks does not apply to {name}: it has a fixed number of NPUs per server; "
                            "use --servers N")
        params["servers"] = 1 if args.servers is None else args.servers
        if args.superpods is not None:
            params["superpods"] = args.superpods
    elif args.servers is not None or args.ranks is not None or args.superpods is not None:
        raise HcclError("E_PARA", "--servers/--ranks/--superpods do not apply to a rank-table file")
    if args.superpods is not None and lname not in ("atlas900-a3",):
        raise HcclError("E_PARA", f"--superpods applies to atlas900-a3 only, not {name}")
    return topologies.load(name, **params)


def _add_topology_args(p):
    p.add_argument("--topology", default=DEFAULT_TOPOLOGY,
                   help=f"preset ({', '.join(topologies.PRESETS)}) or HCCL rank-table JSON (default {DEFAULT_TOPOLOGY})")
    p.add_argument("--servers", type=int, help="servers of a hardware preset (default 1; per superpod on atlas900-a3)")
    p.add_argument("--superpods", type=int, help="superpods of atlas900-a3 (default 1)")
    p.add_argument("--ranks", type=int, help="ranks of a synthetic preset")
    p.add_argument("--bandwidth", type=float, help="synthetic link bandwidth, bytes/s (default 25e9)")
    p.add_argument("--latency", type=float, help="synthetic link latency, s (default 5e-6)")
    p.add_argument("--reduce-bandwidth", dest="reduce_bandwidth", type=float,
                   help="synthetic reduction bandwidth, bytes/s (default inf)")


def _env_pairs(items):
    env = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise HcclError("E_PARA", f"--env {item!r} is not NAME=VALUE")
        env[key] = value
    return env


def build_parser():
    parser = _Parser(prog="hccl-sim", description="Emulate HCCL collectives on modelled Ascend clusters.")
    parser.add_argument("--version", action="version", version=f"hccl-sim {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    sub.add_parser("torchrun", help="torchrun a torch_npu program unchanged on emulated NPUs "
                   "(hccl-sim torchrun [--topology T] [--servers N] [torchrun options] SCRIPT.py [ARGS])")
    b = sub.add_parser("bench", help="size sweep of one collective (hccl_test / nccl-tests style)")
    b.add_argument("--op", default="allreduce", help=f"one of {', '.join(OPS + VARIABLE)} (default allreduce)")
    b.add_argument("--counts", default=None, help="variable-size ops: how alltoallv / alltoallvc split each rank's "
                   "send buffer among its peers, or allgatherv / reducescatterv split the op into rank blocks: "
                   "uniform (the default), zipf:S (MoE expert loads, exponent S) or a JSON file of weights (a p x p "
                   "matrix; a list of p for allgatherv, reducescatterv)")
    _add_topology_args(b)
    # the options both formats share are read as text: each format converts and checks them its
    # own way (hccl_test's as its source does, hccl_sim.tools.hccl_test), with its own defaults
    b.add_argument("-b", "--minbytes", default=None, help="smallest size, e.g. 8, 1K, 64M (default 16; 64M with "
                   "--format hccl_test)")
    b.add_argument("-e", "--maxbytes", default=None, help="largest size (default 64M)")
    b.add_argument("-f", "--stepfactor", default=None, help="multiply sizes by this (default 4; a float > 1 with "
                   "--format hccl_test, where -i is the default)")
    b.add_argument("-i", "--stepbytes", default=None, help="add this many bytes instead of multiplying (default "
                   "with --format hccl_test: (e - b) / 10)")
    b.add_argument("-d", "--datatype", default=None, help=f"one of {', '.join(DTYPES)} or fp32/fp16/... (default "
                   "float32; with --format hccl_test hccl_test's names: fp32, bfp16, fp8e4m3, ...)")
    b.add_argument("-o", "--redop", default=None, help="sum, prod, max or min (default sum)")
    b.add_argument("-r", "--root", default=None, help="root of broadcast/reduce/scatter (default 0; with --format "
                   "hccl_test also the rank that prints)")
    b.add_argument("--algo", default=None, help="HCCL algorithm token (ring, H-D_R, ...) or an HCCL_ALGO string")
    b.add_argument("--engine", default="local", help="local (threads, real data), ray (one actor per rank, real data), mpi (MPI processes under mpiexec, real data) or timing "
                   "(payload-free) (default local)")
    b.add_argument("--policy", default="hccl", help="algorithm selection when --algo/HCCL_ALGO do not fix it: "
                   "hccl (HCCL's rules) or model (fastest by the timing model) (default hccl)")
    b.add_argument("-n", "--iters", default=None,
                   help="timed iterations per size (default 5; 20 with --format hccl_test)")
    b.add_argument("-w", "--warmup_iters", default=None,
                   help="untimed iterations per size (default 1; 10 with --format hccl_test)")
    b.add_argument("--format", default="nccl", help="output: nccl (nccl-tests' table, the default) or hccl_test "
                   "(hccl_test's output, options, defaults and checks as its source has them; docs/references.md §11.5)")
    b.add_argument("-p", "--npus-per-node", "--npus", dest="npus_per_node", default=None,
                   help="hccl_test's NPUs per node: must be the topology's ranks per server")
    b.add_argument("-z", "--zero-copy", "--zero_copy", dest="zero_copy", default=None,
                   help="hccl_test's zero-copy switch: 0 (the default: staged through the CCL buffer); 1 with "
                   "--format hccl_test on atlas900-a3 for allreduce, reducescatter, allgather, broadcast (no "
                   "staging copies) and alltoall (hccl_test's sizes); refused elsewhere")
    b.add_argument("--ranktable", default=None, metavar="FILE",
                   help="HCCL rank table whose servers and devices the ranks take in order (instead of --topology)")
    b.add_argument("--ranks-per-process", dest="ranks_per_process", type=int, default=1,
                   help="engine mpi: emulated ranks (threads) per MPI process (default 1)")
    b.add_argument("--data-plane", dest="data_plane", default=None,
                   help="engine mpi: window (MPI-3 shared-memory windows; the default when every process is on "
                   "one node) or p2p (Isend/Irecv; the default across nodes)")
    b.add_argument("-c", "--check", default=None, help="1 to verify results, 0 not to (default 1)")
    b.add_argument("--env", action="append", metavar="HCCL_X=VALUE", help="set an HCCL environment variable")
    b.add_argument("--json", default=None, help="also write the results as JSON to this file")
    b.add_argument("--trace", default=None, help="write a Chrome trace (Perfetto) of one op per size to this file")
    b.add_argument("--faults", default=None, metavar="PLAN.yaml", help="run the sweep under a fault plan "
                   "(hccl_sim.FaultPlan YAML); adds each row's retries and simulated time lost")

    c = sub.add_parser("chaos", help="seeded fault campaign: scenarios run against their fault-free twins")
    c.add_argument("-n", "--scenarios", type=int, default=500, help="how many scenarios (default 500)")
    c.add_argument("--seed", type=int, default=0, help="the campaign's seed: the same seed, the same scenarios (default 0)")
    c.add_argument("--engine", default="local", help="local (threads) or ray (one actor per rank) (default local)")
    _add_topology_args(c)
    c.set_defaults(servers=None)
    c.add_argument("--replay", default=None, metavar="N|TOKEN",
                   help="rerun scenario N alone, in full detail (its plan as YAML, every rank's outcome); with "
                        "--script, the scenario of a replay token")
    c.add_argument("--json", default=None, metavar="FILE", help="write every scenario (plan, env, call, outcome, times)")
    c.add_argument("--deadline", type=float, default=60.0, metavar="S",
                   help="wall seconds a run may take before it counts as a HANG (at least HCCL_EXEC_TIMEOUT + 15; "
                        "default 60)")
    from .script_chaos import add_arguments as add_script_arguments
    add_script_arguments(c)

    from ..training.command import add_parser as add_train_parser
    add_train_parser(sub, _add_topology_args)

    r = sub.add_parser("replay", help="price a recorded step's communication (hccl_sim.torch.export_trace) on a "
                       "bigger cluster, its groups laid out by a mesh")
    r.add_argument("trace", help="the trace (JSON) hccl_sim.torch.export_trace wrote")
    r.add_argument("--mesh", required=True, help="the mesh over the topology's ranks, last dimension innermost: "
                   "e.g. dp=512,tp=8 (tp inside a server)")
    _add_topology_args(r)
    t = sub.add_parser("topo", help="describe a topology; export an HCCL rank table")
    t.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY, help="preset name or rank-table JSON")
    t.add_argument("--servers", type=int)
    t.add_argument("--superpods", type=int)
    t.add_argument("--ranks", type=int)
    t.add_argument("--bandwidth", type=float)
    t.add_argument("--latency", type=float)
    t.add_argument("--reduce-bandwidth", dest="reduce_bandwidth", type=float)
    t.add_argument("--route", nargs=2, type=int, metavar=("SRC", "DST"), help="show the route between two ranks")
    t.add_argument("--ranktable", default=None, metavar="FILE", help="write the HCCL rank table (version 1.0; 1.2 for superpods)")
    return parser


def cmd_bench(args) -> int:
    if args.format not in ("nccl", "hccl_test"):
        raise HcclError("E_PARA", f"--format {args.format!r}: expected nccl or hccl_test")
    engine = registry.get(args.engine, "bench", f"--engine {args.engine!r}")
    if not engine.spmd and (args.ranks_per_process != 1 or args.data_plane is not None):
        raise HcclError("E_PARA", "--ranks-per-process and --data-plane are settings of --engine mpi")
    if args.policy not in ("hccl", "model"):
        raise HcclError("E_PARA", f"--policy {args.policy!r}: expected hccl or model")
    if engine.spmd:
        from ..engines.mpi import world
        if world().Get_rank() != 0:       # under mpiexec every process runs the sweep; rank 0 prints it
            sys.stdout = open(os.devnull, "w")
    topo = _bench_topology(args)
    common = dict(algo=args.algo, engine=args.engine, env=_env_pairs(args.env), trace=args.trace, policy=args.policy,
                  faults=None if args.faults is None else FaultPlan.load(args.faults),
                  ranks_per_process=args.ranks_per_process, data_plane=args.data_plane)
    if args.format == "hccl_test":
        from .hccl_test import run
        spec, rows = run(args, topo, common, out=lambda line: print(line, flush=True))
    else:
        from .bench_nccl import run as run_nccl
        spec, rows = run_nccl(args, topo, common)
    if args.json:
        write_json(args.json, spec, topo, rows)
    if args.trace:
        print(f"# trace written to {args.trace}")
    return 0 if all(not r.wrong for r in rows) else 1


def _bench_topology(args):
    """--ranktable FILE, or --topology with its parameters; under --engine mpi a hardware preset
    without --servers gets as many servers as the job's ranks fill."""
    if args.ranktable is not None:
        if args.topology != DEFAULT_TOPOLOGY or args.servers is not None or args.ranks is not None:
            raise HcclError("E_PARA", "--ranktable names the cluster: drop --topology/--servers/--ranks")
        return topologies.load(args.ranktable)
    if registry.get(args.engine, "bench", f"--engine {args.engine!r}").spmd and args.servers is None \
            and args.ranks is None:
        from ..engines.mpi import world
        slots = world().Get_size() * args.ranks_per_process
        lname = topologies.ALIASES.get(args.topology.lower(), args.topology.lower())
        if lname in topologies.SYNTHETIC_PRESETS:
            args.ranks = slots
        elif lname in topologies.HARDWARE_PRESETS:
            per = topologies.load(args.topology, servers=1).num_ranks
            if slots % per == 0 and args.superpods is None:
                args.servers = slots // per
    return _topology(args)


MAX_SCENARIOS = 1_000_000
CHAOS_SERVERS = 2
"""Servers of a hardware preset when chaos is not told (--servers): two, so that faults meet links
inside a server (L0) and between servers (L1)."""


SCRIPT_ONLY = {"nproc": None, "script_args": "", "max_restarts": 0, "kinds": None, "max_faults": 2, "allow": None,
               "script_check": None, "no_shrink": False, "env": None}
"""chaos's options for --script, with their defaults (given without --script: refused)."""


def cmd_chaos(args) -> int:
    from ..chaos import report
    if not 1 <= args.scenarios <= MAX_SCENARIOS:
        raise HcclError("E_PARA", f"-n {args.scenarios}: the number of scenarios must be in [1, {MAX_SCENARIOS}]")
    if not (args.deadline > 0 and math.isfinite(args.deadline)):
        raise HcclError("E_PARA", f"--deadline {args.deadline}: wall seconds > 0")
    if args.script is not None:
        from .script_chaos import cmd_script_chaos
        return cmd_script_chaos(args, _topology, _env_pairs)
    given = [name for name, default in SCRIPT_ONLY.items() if getattr(args, name) != default]
    if given:
        raise HcclError("E_PARA", f"chaos: --{given[0].replace('_', '-')} is an option of a script's fault suite "
                        "(--script FILE.py)")
    if args.replay is not None:
        if not args.replay.isdigit():
            raise HcclError("E_PARA", f"--replay {args.replay}: a scenario number is an integer >= 0 (a replay "
                            "token goes with --script)")
        args.replay = int(args.replay)
    registry.get(args.engine, "chaos", f"--engine {args.engine!r}")
    lname = topologies.ALIASES.get(args.topology.lower(), args.topology.lower())
    if lname in topologies.HARDWARE_PRESETS and args.servers is None:
        args.servers = CHAOS_SERVERS
    topo = _topology(args)
    if topo.num_ranks < 2:
        raise HcclError("E_PARA", f"chaos needs at least 2 ranks (faults are between ranks); {topo.name} has "
                        f"{topo.num_ranks}")
    from .. import _check_local_size
    _check_local_size(topo, registry.ENGINES[args.engine])
    replay = args.replay is not None
    bar = []

    def start(space, total):
        print(report.header(args.seed, total, topo, args.engine, space, table=not replay), flush=True)
        if not replay:
            bar.append(report.progress_bar(total))

    def done(sc, result):
        if replay:
            print(report.replay_text(sc, result), flush=True)
            return
        line = report.row(sc, result)
        if bar and bar[0] is not None:
            bar[0].write(line, file=sys.stdout)
            bar[0].update(1)
        else:
            print(line, flush=True)
    try:
        space, results, left = report.run_campaign(args.seed, args.scenarios, topo, engine=args.engine,
                                                   deadline_s=args.deadline, only=args.replay, on_start=start,
                                                   on_result=done)
    finally:
        if bar and bar[0] is not None:
            bar[0].close()
    print(report.format_summary(results, left))
    if args.json:
        report.write_json(args.json, args.seed, topo, args.engine, space, results, left)
        print(f"# scenarios written to {args.json}")
    return 1 if report.failed(results, left) else 0


def cmd_topo(args) -> int:
    topo = _topology(args)
    p = topo.num_ranks
    pairs = [tuple(args.route)] if args.route else ([(0, p - 1)] if p > 1 else [])
    if not args.route and topo.num_servers > 1:
        pairs = [(0, 1), (0, topo.server_of.index(1))]
        pods = topo.params.get("superpod_of_server")
        if pods and len(set(pods)) > 1:           # and one into the next superpod
            pairs.append((0, topo.server_of.index(pods.index(pods[-1]))))
    routes = [topo.route(src, dst) for src, dst in pairs]     # a bad --route fails before any output
    print(topo.summary())
    for (src, dst), route in zip(pairs, routes):
        bw = "inf" if math.isinf(route.bandwidth) else f"{route.bandwidth / 1e9:g} GB/s"
        if route.port_bandwidth != route.bandwidth:          # one pair does not fill the port
            bw += f" per pair (its ports {route.port_bandwidth / 1e9:g} GB/s)"
        print(f"route {src} -> {dst}: {' -> '.join(map(str, route.hops))} over {route.kind}, "
              f"latency {route.latency_ns / 1000:g} us, bottleneck {bw}, ports {route.egress[1]} -> {route.ingress[1]}")
    if args.ranktable:
        topologies.ranktable.save(topo, args.ranktable)
        print(f"rank table written to {args.ranktable}")
    return 0


def cmd_replay(args) -> int:
    from . import trace_replay as replay
    trace, mesh = replay.load(args.trace), replay.parse_mesh(args.mesh)
    topo = _topology(args)
    print(replay.report(replay.replay(trace, topo, mesh), trace, topo))
    return 0


def cmd_train(args) -> int:
    from ..training.command import run_command
    return run_command(args, _topology, _env_pairs)


def main(argv=None) -> int:
    shown = set()

    def one_line(message, category, filename, lineno, file=None, line=None):
        # each warning once, on one line (a bench sweep re-reads env= for every size)
        if str(message) not in shown:
            shown.add(str(message))
            print(f"hccl-sim: warning: {message}", file=sys.stderr)
    with warnings.catch_warnings():
        warnings.showwarning = one_line
        return _main(argv)


def _main(argv) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["torchrun"]:      # every other option is torchrun's own: not parsed here
            from .npu_launch import main as torchrun
            return torchrun(argv[1:])
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        return {"bench": cmd_bench, "topo": cmd_topo, "chaos": cmd_chaos, "train": cmd_train,
                "replay": cmd_replay}[args.command](args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    except HcclError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename or ''}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
