"""A torch script as a subject of hccl-sim: `launch(script, nproc)` runs it, unchanged, on `nproc`
emulated NPUs and returns what each rank reported (`report(value)`), as `hccl_sim.run` returns a
function's results.

The script is whatever a user runs under torchrun: it calls `dist.init_process_group("hccl_sim")`
(env://, as torchrun sets it up) and trains. Each rank runs it as `Script`, a rank function
`fn(comm)`: the rank's world communicator is made first and given to this process's World
(hccl_sim.torch.world), so the script's init_process_group takes it; the script runs as
`__main__` with its arguments; the rank's result is the last value it passed to `report`. So a
script goes wherever a rank function goes:

- engine "torchrun": `python -m torch.distributed.run --nproc-per-node N` starts one process per
  rank (hccl_sim.torch.script_rank: the rank's communicator from torchrun's store, then the
  function); `max_restarts` is torchrun's `--max-restarts` (elastic restarts; a fault plan is the
  job's first attempt's, hccl_sim.engines.torchrun.config_from_env);
- engine "ray": `hccl_sim.run(Script(...), engine="ray")`, the store env:// needs hosted here.

Either way the run goes through hccl_sim.engines.interception, so a fault suite (hccl_sim.testing,
the pytest plugin, `hccl-sim chaos --script`) applies its scenarios to a test that launches a
script as to one that calls hccl_sim.run.
"""
from __future__ import annotations

import os
import pickle
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from topologies.errors import HcclError

ENGINES = ("torchrun", "ray")
RESULT_FILE = "rank{rank}.{attempt}.pkl"
JOB_FILE = "job.pkl"


def report(value) -> None:
    """Make `value` this rank's result of a launched script (the last call wins): what
    `launch` returns for the rank and what a fault suite compares with the fault-free twin's
    (losses, parameters: tensors compare by value). Outside a launch it is kept and unused."""
    from . import world
    world().reported = value


class Script:
    """A torch script as a rank function (picklable): run `path` as `__main__` with `args` on this
    rank, its world communicator `comm` ready for the script's `dist.init_process_group`; returns
    what the script reported (None if nothing). `store`: (host, port) of a TCPStore to use as
    env://'s (a Ray run's, which the driver hosts; None under torchrun, which sets env:// up)."""

    def __init__(self, path, args=(), store=None, local_world=None, npu=False):
        self.path, self.args, self.store, self.local_world = str(path), tuple(str(a) for a in args), store, local_world
        self.npu = npu                    # a torch_npu script: emulated NPUs installed first

    def __call__(self, comm):
        from . import world
        if self.npu:
            from .npu import install
            install()
        w = world()
        if dist.is_initialized():
            raise HcclError("E_PARA", "torch.distributed is already initialised in this process "
                            "(dist.destroy_process_group() first)", rank=comm.rank)
        saved_env, saved_argv, saved_path = dict(os.environ), list(sys.argv), list(sys.path)
        if self.store is not None:        # env:// as torchrun would set it up, on the driver's store
            local = self.local_world or comm.size
            os.environ.update(MASTER_ADDR=self.store[0], MASTER_PORT=str(self.store[1]), RANK=str(comm.rank),
                              WORLD_SIZE=str(comm.size), LOCAL_RANK=str(comm.rank % local),
                              LOCAL_WORLD_SIZE=str(local), TORCHELASTIC_USE_AGENT_STORE="True")
        own = w.comm is None
        if own:
            w.comm = comm
        w.reported = w.failed = None
        w.script_failed = True             # until the script ends well (the rank's process exits by it)
        sys.argv = [self.path, *self.args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(self.path)))    # as `python script.py` does
        try:
            try:
                runpy.run_path(self.path, run_name="__main__")
                w.script_failed = False
            except SystemExit as exc:       # the script's own exit: 0 (or None) is a normal end
                w.script_failed = exc.code not in (None, 0)
                if w.script_failed:
                    raise HcclError("E_INTERNAL", f"{self.path} exited with status {exc.code!r}",
                                    rank=comm.rank) from None
            except Exception as exc:       # noqa: BLE001 - torch turns a failed op's error into its own
                failed = w.failed               # (an HcclError, or the plan's stall of this rank)
                if failed is not None and not isinstance(exc, HcclError):
                    raise failed from exc
                raise
            return w.reported
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            if own:
                w.comm = None
            w.reported = None
            sys.argv, sys.path[:] = saved_argv, saved_path
            os.environ.clear()
            os.environ.update(saved_env)


def launch(script, nproc: int, args=(), topology=None, engine: str = "torchrun", env: dict | None = None,
           faults=None, max_restarts: int = 0, monitor_interval: float = 1.0, timeout_s: float | None = None,
           cluster=None, npu: bool = False):
    """Run the torch script `script` (a path) on `nproc` ranks and return each rank's reported
    value (None for a rank the fault plan crashed or stalled), as hccl_sim.run: a rank's error
    reaches the caller as the engines' root cause. `topology`: as for hccl_sim.run (default one
    910B server filled by the ranks); `env`: HCCL's variables; `faults`: a FaultPlan;
    `max_restarts` (torchrun): torchrun's elastic restarts of the whole job, the last attempt's
    results returned; `monitor_interval`: how often torchrun looks at its workers (s; a rank it
    stops before the rank has ended finishes first: hccl_sim.torch.script_rank); `timeout_s`: a wall limit on the whole job (default: none beyond the ranks' own waits);
    `cluster`: a hccl_sim.Cluster on Ray to run on (its actors, torch imported once, serve launch
    after launch; its topology is the launch's); `npu`: a torch_npu script, run on emulated NPUs
    (hccl_sim.torch.npu installed in every rank first; on Ray that changes the actors' torch for
    good: its accelerator is npu from then on)."""
    from .. import _topology
    from ..config.env import Config
    from ..engines import interception
    from ..plan.faulted import with_faults
    path = Path(script)
    if not path.is_file():
        raise HcclError("E_PARA", f"launch: no script at {script!r}")
    if engine not in ENGINES:
        raise HcclError("E_PARA", f"launch: engine {engine!r} is not one of {', '.join(ENGINES)}")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise HcclError("E_PARA", f"launch: nproc must be a positive integer, got {nproc!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise HcclError("E_PARA", f"launch: max_restarts must be a non-negative integer, got {max_restarts!r}")
    if engine == "ray" and max_restarts:
        raise HcclError("E_NOT_SUPPORT", "launch: max_restarts is torchrun's elastic restart (engine torchrun); on "
                        "Ray, recover in the script (abort and shrink) instead")
    if cluster is not None:
        if engine != "ray" or topology is not None:
            raise HcclError("E_PARA", "launch: a cluster is given with engine='ray' and no topology of its own")
        topology = cluster.topology
    topo = _topology(topology) if topology is not None else _filled(nproc)
    if topo.num_ranks != nproc:
        raise HcclError("E_PARA", f"launch: the topology has {topo.num_ranks} ranks but nproc is {nproc}")
    if engine == "ray":
        if cluster is not None:
            return _on_ray(lambda fn: cluster.run(fn, env=env, faults=faults), path, args, topo, npu)
        from .. import run
        return _on_ray(lambda fn: run(fn, topology=topo, engine="ray", env=env, faults=faults), path, args, topo, npu)

    def config_for(plan):
        return with_faults(topo, Config.from_env(env), plan)
    job = _TorchrunJob(path, args, topo, env, max_restarts, monitor_interval, timeout_s, config_for(None), npu)
    fn = Script(path, args, npu=npu)
    hook = interception.current()
    if hook is not None:
        return hook.run(interception.Run(fn, (), {}, topo, "torchrun", faults, config_for, job.launch, job.abandon))
    return job.launch(fn, config_for(faults))


def _filled(nproc):
    from topologies import presets
    from ..engines.torchrun import DEFAULT_TOPOLOGY
    return presets.filled(DEFAULT_TOPOLOGY, nproc)


def _on_ray(run, path, args, topo, npu=False):
    """The script on Ray actors (`run(fn)` runs a rank function there): env://'s store hosted by
    this (the driver's) process."""
    import ray
    store = dist.TCPStore("0.0.0.0", 0, topo.num_ranks, True, wait_for_workers=False)
    try:
        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        local = max(topo.server_of.count(s) for s in set(topo.server_of))
        return run(Script(path, args, (host, store.port), local, npu))
    finally:
        del store


class _TorchrunJob:
    """One launch under torchrun: a job directory holding the rank function and its Configs
    (the first attempt's and the restarts' fault-free one), where each rank leaves its end."""

    def __init__(self, path, args, topo, env, max_restarts, monitor_interval, timeout_s, clean_config, npu=False):
        self.path, self.args, self.topo, self.env, self.npu = path, args, topo, env, npu
        self.max_restarts, self.monitor_interval, self.timeout_s = max_restarts, monitor_interval, timeout_s
        self.clean_config = clean_config
        self.proc = None

    def launch(self, fn, config) -> list:
        from hcomm.memory import segments
        from ..engines.rendezvous import root_cause
        from .script_rank import END_ERROR, END_STALLED
        job = Path(tempfile.mkdtemp(prefix="hccl-sim-torchrun-"))
        session = segments.new_session()        # named for this process: what the job leaves is ours to see
        try:
            with open(job / JOB_FILE, "wb") as f:
                pickle.dump({"fn": fn, "config": config, "clean": self.clean_config, "topology": self.topo,
                             "session": session}, f)
            out = self._torchrun(job, config)
            ends, attempt = _ends(job, self.topo.num_ranks)
        finally:
            shutil.rmtree(job, ignore_errors=True)
            for a in range(self.max_restarts + 1):      # a crashed rank's segments (it closed nothing)
                segments.cleanup(f"{session}-{a}")
        # the plan is the first attempt's: a rank missing from a restart's ends died unplanned
        planned = {c[0] for c in config.faults.crashes} if config.faults is not None and attempt == 0 else set()
        results, errors = [], []
        for rank, end in enumerate(ends):
            if end is None:
                if rank in planned:
                    results.append(None)
                    continue
                end = (END_ERROR, HcclError("E_INTERNAL", f"rank {rank} ended without a result (its process died or "
                                            f"torchrun stopped it); torchrun said:\n{out}", rank=rank), time.time())
            kind, *rest = end
            if kind == END_STALLED:
                results.append(None)
            elif kind == END_ERROR:
                errors.append((rank, rest[0], rest[1]))
                results.append(None)
            else:
                results.append(rest[0])
        if errors:
            raise root_cause(errors)[1]
        return results

    def _torchrun(self, job, config) -> str:
        n = self.topo.num_ranks
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
               f"--max-restarts={self.max_restarts}", f"--monitor-interval={self.monitor_interval}",
               "-m", "hccl_sim.torch.script_rank", str(job)]
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (self.env or {}).items()})
        env.pop("HCCL_SIM_FAULTS", None)             # the job's plan travels in its Config
        if self.npu:
            env["HCCL_SIM_NPU"] = "1"                # every rank's import of hccl_sim.torch installs them
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=os.getcwd())
        try:
            out, _ = self.proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.abandon()
            out, _ = self.proc.communicate(timeout=30)
            raise HcclError("E_TIMEOUT", f"launch: {self.path} did not end within {self.timeout_s} s; torchrun "
                            f"said:\n{_tail(out.decode(errors='replace'))}") from None
        finally:
            if self.proc.poll() is None:
                self.abandon()
        return _tail(out.decode(errors="replace"))

    def abandon(self) -> None:
        """End the job: torchrun and its workers (their own session), SIGTERM then SIGKILL."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _ends(job: Path, n: int) -> tuple:
    """(each rank's end in the job's last attempt, None where it recorded none; that attempt)."""
    found = {}
    for f in job.glob("rank*.pkl"):
        rank, attempt = (int(x) for x in f.name[4:-4].split("."))
        found.setdefault(rank, {})[attempt] = f
    last = max((a for per in found.values() for a in per), default=0)
    ends = []
    for rank in range(n):
        f = found.get(rank, {}).get(last)
        ends.append(None if f is None else pickle.loads(f.read_bytes()))
    return ends, last


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
