"""`hccl-sim chaos --script train.py --nproc 8 -n 50`: a torch script's fault suite from the command
line, as `pytest --hccl-chaos` runs a test's.

The script runs unchanged on emulated NPUs (hccl_sim.torch.launch, under torchrun or on Ray): once
fault-free (the twin), then under N scenarios aimed at the calls the twin made
(hccl_sim.testing.explore). A rank's result is what it passed to `hccl_sim.torch.report` (its
losses, its parameters), compared with the twin's bit for bit, or by `--check FILE.py:FUNCTION`
(`check(results, twin_results)`, results by rank, None for a rank the plan crashed). A failure
(WRONG, HANG, LEAK, or an error the allowed codes do not list) is shrunk and printed with its plan
as YAML and the command that replays it; the exit status is then 1.
"""
from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import topologies
from topologies.errors import HcclError

SCRIPT_ENGINES = ("torchrun", "ray")


def add_arguments(c) -> None:
    """The chaos command's options for a script."""
    c.add_argument("--script", default=None, metavar="FILE.py",
                   help="a torch script to run under the scenarios (its ranks' hccl_sim.torch.report values are "
                        "compared with the fault-free run's)")
    c.add_argument("--nproc", type=int, default=None, help="ranks of the script (torchrun's --nproc-per-node)")
    c.add_argument("--args", dest="script_args", default="", metavar="'ARGS'", help="the script's arguments, quoted")
    c.add_argument("--max-restarts", dest="max_restarts", type=int, default=0,
                   help="torchrun's elastic restarts of the script's job (engine torchrun; default 0)")
    c.add_argument("--kinds", default=None, metavar="K1,K2", help="fault kinds to draw (default: every kind)")
    c.add_argument("--max-faults", dest="max_faults", type=int, default=2, help="entries per scenario (default 2)")
    c.add_argument("--allow", default=None, metavar="E_X,E_Y",
                   help="error codes a clean error may have (default E_REMOTE,E_TIMEOUT,E_OPRETRY_FAIL)")
    c.add_argument("--check", dest="script_check", default=None, metavar="FILE.py:FUNCTION",
                   help="check(results, twin_results) -> None or a complaint, for results not equal by design")
    c.add_argument("--no-shrink", dest="no_shrink", action="store_true", help="report the first failure as drawn")
    c.add_argument("--env", action="append", metavar="HCCL_X=VALUE", help="set an HCCL environment variable")


def cmd_script_chaos(args, topology_of, env_pairs) -> int:
    """The script's fault suite (see the module's doc); `topology_of(args)` is the CLI's topology
    reading, `env_pairs` its --env parser."""
    import hccl_sim.torch
    from ..testing import explore, replay
    from ..testing.verdict import DEFAULT_ALLOW, FAILING
    script = Path(args.script)
    if not script.is_file():
        raise HcclError("E_PARA", f"--script {args.script}: no such file")
    if args.nproc is None or args.nproc < 2:
        raise HcclError("E_PARA", f"--nproc {args.nproc}: a script's fault suite needs at least 2 ranks")
    engine = "torchrun" if args.engine == "local" else args.engine
    if engine not in SCRIPT_ENGINES:
        raise HcclError("E_PARA", f"--engine {args.engine}: a script runs under torchrun or on ray")
    topo = _script_topology(args, topology_of)
    env = env_pairs(args.env)
    check = _load_check(args.script_check) if args.script_check else None
    allow = tuple(a.strip() for a in args.allow.split(",") if a.strip()) if args.allow else DEFAULT_ALLOW
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip()) if args.kinds else None
    script_args = shlex.split(args.script_args)
    name = f"{script.name} --nproc {args.nproc}"
    cluster = None
    if engine == "ray":
        cluster = hccl_sim.Cluster(topo, engine="ray")
        topo_arg = None
    else:
        topo_arg = topo

    def body():
        return hccl_sim.torch.launch(script, args.nproc, script_args, topology=topo_arg, engine=engine, env=env,
                                     max_restarts=args.max_restarts, cluster=cluster)
    try:
        if args.replay is not None:
            scenario = replay(body, args.replay, name, allow, check, args.deadline)
            print(f"# replay of {args.replay} on {engine}: {scenario.outcome} ({scenario.words})")
            if scenario.verdict.detail:
                print(f"# {scenario.verdict.detail}")
            print(_yaml(scenario.plan), end="")
            return 1 if scenario.outcome in FAILING else 0
        print(f"# hccl-sim chaos --script {args.script}: {args.nproc} ranks on {topo.name} ({engine}), seed {args.seed}, "
              f"{args.scenarios} scenarios", flush=True)
        report = explore(body, name, args.scenarios, args.seed, kinds, args.max_faults, allow, check, args.deadline,
                         shrink=not args.no_shrink)
    finally:
        if cluster is not None:
            cluster.close()
    print(f"# twin: {report.twin_s:.1f} s")
    for i, sc in enumerate(report.scenarios):
        print(f"  {i:>4} {sc.outcome:<12} {sc.wall_s:>6.1f} s  {sc.words}" + (f"  | {sc.verdict.detail[:160]}"
                                                                          if sc.outcome in FAILING else ""))
    print(report.summary())
    if args.json:
        Path(args.json).write_text(json.dumps({"tests": [report.to_dict()]}, indent=1, default=str))
    if report.failure is None:
        return 0
    shrunk = report.shrunk or report.failure
    print(f"# first failure: scenario {len(report.scenarios) - 1}: {report.failure.outcome}: "
          f"{report.failure.verdict.detail}")
    print(f"# shrunk in {report.shrink_runs} runs ({report.shrink_s:.1f} s) to: {shrunk.outcome}: {shrunk.verdict.detail}")
    print(_yaml(shrunk.plan), end="")
    print("replay: " + shlex.join(replay_command(args, engine) + ["--replay", report.token]))
    return 1


def replay_command(args, engine) -> list:
    """The command line that reruns this suite's runs: every option that shapes a run or its
    verdict (the scenario itself comes from the token)."""
    cmd = ["hccl-sim", "chaos", "--script", args.script, "--nproc", str(args.nproc), "--engine", engine,
           "--topology", args.topology]
    for flag, value in (("--servers", args.servers), ("--superpods", args.superpods), ("--ranks", args.ranks),
                        ("--args", args.script_args or None), ("--allow", args.allow),
                        ("--check", args.script_check), ("--deadline", args.deadline)):
        if value is not None:
            cmd += [flag, str(value)]
    if args.max_restarts:
        cmd += ["--max-restarts", str(args.max_restarts)]
    for item in args.env or ():
        cmd += ["--env", item]
    return cmd


def _script_topology(args, topology_of):
    """The script's topology: a hardware preset filled by the ranks unless --servers says how many
    servers; anything else as the CLI reads it, with exactly --nproc ranks."""
    from topologies import presets
    lname = topologies.ALIASES.get(args.topology.lower(), args.topology.lower())
    if lname in topologies.HARDWARE_PRESETS and args.servers is None and args.superpods is None:
        return presets.filled(args.topology, args.nproc)
    if lname in topologies.SYNTHETIC_PRESETS and args.ranks is None:
        args.ranks = args.nproc
    topo = topology_of(args)
    if topo.num_ranks != args.nproc:
        raise HcclError("E_PARA", f"--nproc {args.nproc}: the topology {topo.name} has {topo.num_ranks} ranks")
    return topo


def _load_check(spec: str):
    path, sep, fn = spec.rpartition(":")
    if not sep or not path or not fn:
        raise HcclError("E_PARA", f"--check {spec}: give FILE.py:FUNCTION")
    if not Path(path).is_file():
        raise HcclError("E_PARA", f"--check {spec}: no such file {path}")
    loaded = importlib.util.spec_from_file_location(f"hccl_sim_check_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    check = getattr(module, fn, None)
    if not callable(check):
        raise HcclError("E_PARA", f"--check {spec}: {path} has no function {fn}")
    return check


def _yaml(plan) -> str:
    import yaml
    return yaml.safe_dump(plan.to_dict(), sort_keys=False, default_flow_style=None)
