"""torch's own distributed test suite on the hccl_sim backend, next to gloo: what passes, fails, is skipped.

Runs `DistributedTest._DistTestBase` from torch.testing._internal.distributed.distributed_test the way
torch's test/distributed/test_distributed_spawn.py does (a class on TestDistBackend + _DistTestBase whose
setUp spawns WORLD_SIZE=4 rank processes; BACKEND, INIT_METHOD=file://..., TEMP_DIR set as
common_distributed expects), once per backend, each backend in its own worker subprocess (this file
with TORCH_CONFORMANCE_BACKEND set), and writes a Markdown table (+ JSON per case).

    python experiments/torch_conformance.py                      # both backends, every case
    python experiments/torch_conformance.py --backend gloo -k test_all_reduce_sum
    python experiments/torch_conformance.py --gates-as-gloo --backend hccl_sim
    [-k EXPR] [--timeout S (per case, 120)] [--grace S (90)] [--jobs N (1)] [--out FILE.md] [--json FILE]

How the suite's backend gates are decided. distributed_test reads BACKEND from the environment once, at
import, and most gates are decorators evaluated then (`skip_but_pass_in_sandcastle_if(BACKEND not in
DistTestCases.backend_feature[...])`, `require_backend_is_available`, `BACKEND == "gloo"` ...); the
feature sets live in common_distributed. So, in the worker and in every spawned rank (spawn re-imports
this main module before unpickling the test class, so the same import-time code runs there):
- default (own gates): BACKEND=<backend>; for hccl_sim, `import hccl_sim.torch` (registers the
  backend), then "hccl_sim" is added to backend_feature["ddp"], ["subgroup"], ["plugin"] (as a
  third-party backend would be), and only then distributed_test is imported, so its gates see them.
- --gates-as-gloo: BACKEND=gloo when distributed_test is imported and stays gloo (module global and
  os.environ), so every gate, import-time or in a test body, is decided exactly as for gloo; the feature
  sets are untouched. The cases run on hccl_sim because c10d's `_new_process_group_helper` (the one
  place init_process_group, new_group and new_subgroups create a group) is wrapped to turn a "gloo"
  request into "hccl_sim" - so the suite's explicit `new_group(backend="gloo")` side groups run on
  hccl_sim too. dist.get_backend() then says "hccl_sim", which a few gloo-expecting asserts notice.
Skips and failures are noted by the rank processes themselves (exception type + first line, stamped
with the monotonic clock: the first rank to fail is the cause), since the parent only sees exit codes
("Test skipped at subprocess level") or a traceback blob; where no rank noted anything the parent's own
verdict is read out of that blob (a rank's traceback, a timeout, an exit code).

The driver follows each worker's events; a case with no end past --timeout + --grace, a worker that
dies, or one stalled outside any case for as long is killed (its whole process group) and restarted
after that case, which fails with the verdict. Restarts, rank processes left behind, and hccl-sim
/dev/shm segments of killed ranks (removed) are listed in the report.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_SRC = "TORCH_CONFORMANCE_SRC"           # the run's snapshot of the project's packages
sys.path.insert(0, os.environ.get(ENV_SRC, REPO))
PACKAGES = ("hccl_sim", "hcomm", "topologies")   # pyproject's packages

ENV_BACKEND = "TORCH_CONFORMANCE_BACKEND"   # set: this process is a worker or one of its ranks
ENV_GATES = "TORCH_CONFORMANCE_GATES"       # "own" or "gloo"
ENV_NOTES = "TORCH_CONFORMANCE_NOTES"       # directory where ranks note why they failed / skipped
ENV_EVENTS = "TORCH_CONFORMANCE_EVENTS"     # the worker's JSON-lines progress file, read by the driver
WORLD_SIZE = 4
SHM_NAME = re.compile(r"^hccl_sim_[A-Za-z0-9]+-(\d+)-[0-9a-f]+(?:_.*_(\d+)_\d+)?$")  # session pid, creator pid


def one_line(exc) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:300]


# ---- suite side: runs at import in the worker and in every rank process it spawns ---------------------

def _note(test_name, rank, kind, exc):
    """A rank's own account of why it failed / skipped (the parent gets only exit codes), stamped
    with the machine-wide monotonic clock: file times tick in jiffies, too coarse to tell which
    of four ranks failing within milliseconds failed first (the others' errors follow from it).
    A rank's first note of a kind stands (its later ones are consequences)."""
    path = os.path.join(os.environ[ENV_NOTES], f"{test_name}.{kind}.{rank}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(f"{time.monotonic_ns()} {one_line(exc)}")


def _redirect_gloo_to(backend):
    """--gates-as-gloo: every group the suite asks gloo for is made on `backend` instead."""
    import torch.distributed.distributed_c10d as c10d
    create = c10d._new_process_group_helper

    def helper(group_size, group_rank, global_ranks_in_group, requested, *args, **kwargs):
        if str(requested).lower() == "gloo":
            requested = c10d.Backend(backend)
        return create(group_size, group_rank, global_ranks_in_group, requested, *args, **kwargs)
    c10d._new_process_group_helper = helper


def _build_suite():
    backend, gates = os.environ[ENV_BACKEND], os.environ[ENV_GATES]
    os.environ["BACKEND"] = "gloo" if gates == "gloo" else backend
    os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
    if backend == "hccl_sim":
        import hccl_sim.torch  # noqa: F401 - registers the backend in this process
    import torch
    from torch.testing._internal import common_distributed as cd
    if backend == "hccl_sim" and gates == "own":
        for feature in ("ddp", "subgroup", "plugin"):     # before distributed_test's decorators read them
            cd.DistTestCases.backend_feature[feature].add("hccl_sim")
    from torch.testing._internal.distributed import distributed_test as dt
    if gates == "gloo" and backend != "gloo":
        _redirect_gloo_to(backend)
    # one per-case limit for the suite's own join (it terminates the ranks and fails the case)
    timeout = int(os.environ.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120"))
    cd.TIMEOUT_DEFAULT = timeout
    cd.TIMEOUT_OVERRIDE.clear()
    torch.backends.cuda.matmul.allow_tf32 = False        # as test_distributed_spawn.py

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def _start_processes(self, proc):
            super()._start_processes(proc)
            _event(event="pids", case=self._current_test_name(), pids=[p.pid for p in self.processes])

        def tearDown(self):
            procs = list(self.processes)
            super().tearDown()                            # terminates the ranks (SIGTERM)
            for p in procs:                               # ... and makes sure they are gone
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(5)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            try:                                          # init_process_group / barrier / destroy errors
                super()._run(rank, test_name, file_name, pipe, **kwargs)
            except Exception as exc:
                _note(test_name, rank, "error", exc)
                raise

        def run_test(self, test_name, parent_pipe):
            case = getattr(self, test_name)

            def noting():                                 # run_test turns these into bare exit codes
                try:
                    case()
                except Exception as exc:
                    _note(test_name, self.rank, "skip" if isinstance(exc, unittest.SkipTest) else "error", exc)
                    raise
            setattr(self, test_name, noting)
            super().run_test(test_name, parent_pipe)

    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"   # picklable by name for spawn
    return TestDistBackendWithSpawn, cd.TEST_SKIPS["generic"].message


def _event(**fields):
    path = os.environ.get(ENV_EVENTS)
    if path:                                      # (called in the worker only, never in a rank)
        with open(path, "a") as f:
            f.write(json.dumps(fields | {"t": time.time()}) + "\n")


if os.environ.get(ENV_BACKEND):
    TestDistBackendWithSpawn, GENERIC_SKIP = _build_suite()


class Recorder(unittest.TestResult):
    """Each case's outcome as an event, with a one-line reason, preferring what its ranks noted."""

    def startTest(self, test):
        super().startTest(test)
        self.outcome, self.reason, self.t0 = None, None, time.time()
        _event(event="start", case=_name(test))

    def _notes(self, test, kind):
        """The note of the rank that wrote first (the cause), as 'rank R: Type: message'."""
        notes, prefix, found = os.environ[ENV_NOTES], f"{_name(test)}.{kind}.", []
        for n in os.listdir(notes):
            if n.startswith(prefix):
                with open(os.path.join(notes, n)) as f:
                    stamp, _, line = f.read().partition(" ")
                found.append((int(stamp), int(n[len(prefix):]), line))
        if found:
            _, rank, line = min(found)
            return f"rank {rank}: {line}"

    def _set(self, outcome, reason=None):
        if self.outcome != "failed":                      # a failing tearDown after a pass wins
            self.outcome, self.reason = outcome, reason

    def addSuccess(self, test):
        self._set("passed")

    def addSkip(self, test, reason):
        self._set("skipped", (reason == GENERIC_SKIP and self._notes(test, "skip")) or reason)

    def addFailure(self, test, err):
        note, verdict = self._notes(test, "error"), parent_reason(err[1])
        if note and not verdict.startswith("rank "):      # e.g. a rank failed, another hung: both matter
            note = f"{note} (then the parent: {verdict})"
        self._set("failed", note or verdict)

    addError = addFailure                                 # (no expected failures, no parent-side subtests)

    def stopTest(self, test):
        super().stopTest(test)
        _event(event="end", case=_name(test), outcome=self.outcome or "failed",
               reason=self.reason or ("no outcome reported" if not self.outcome else None),
               seconds=time.time() - self.t0)


def parent_reason(exc) -> str:
    """The parent's verdict in one line. common_distributed raises one of: 'Process R exited with error
    code 10 and exception:' + the rank's traceback (the cause is that traceback's last line), 'Process R
    terminated or timed out after S seconds', or assertEqual's 'Scalars are not equal! ...' whose last
    line says 'Expected exit code C but got X for pid: P' (a rank killed by a signal)."""
    text = str(exc)
    errored = re.match(r"Process (\d+) exited with error code \d+ and exception:\n(.*?)(?=^Process \d+ exited|\Z)",
                       text, re.S | re.M)
    if errored:                                   # the traceback's last unindented line is the exception
        lines = [ln for ln in errored[2].splitlines() if ln.strip() and not ln[0].isspace()
                 and not ln.startswith(("Traceback", "During handling", "The above exception"))]
        return f"rank {errored[1]}: {lines[-1].strip()[:300]}" if lines else one_line(exc)
    code = re.search(r"Expected exit code .*", text)
    line = f"{type(exc).__name__}: {code[0].strip()}"[:300] if code else one_line(exc)
    return re.sub(r"(\d+\.\d)\d+ seconds", r"\1 seconds", line)       # so equal verdicts group together


def _name(test):
    return test.id().rsplit(".", 1)[-1]


def worker(cases_file):
    """Run the listed cases (or print every case name with cases_file '-')."""
    cls = TestDistBackendWithSpawn
    names = unittest.TestLoader().getTestCaseNames(cls)
    if cases_file == "-":
        print(json.dumps(list(names)))
        return
    with open(cases_file) as f:
        wanted = json.load(f)
    unittest.TestSuite([cls(n) for n in wanted]).run(Recorder())   # the suite runs setUpClass


# ---- driver side ---------------------------------------------------------------------------------------

def select(names, expr):
    """-k: a regex searched in each case name (so a plain substring works), or several such terms joined
    pytest-like with and / or / not and parentheses."""
    if not expr:
        return list(names)
    tokens = re.findall(r"[()]|[^\s()]+", expr)
    code = " ".join(t if t in ("and", "or", "not", "(", ")") else f"found({t!r})" for t in tokens)
    try:
        return [n for n in names if eval(code, {"found": lambda t, n=n: re.search(t, n) is not None})]  # noqa: S307
    except (SyntaxError, re.error) as exc:
        raise SystemExit(f"-k {expr!r}: not a selection ({type(exc).__name__}: {exc})") from None


def shm_of(pids) -> dict:
    """/dev/shm entries hccl-sim made for a session led by, or in, a process among `pids` -> its case."""
    out = {}
    for n in os.listdir("/dev/shm"):
        m = SHM_NAME.match(n)
        owner = m and next((int(p) for p in m.groups() if p and int(p) in pids), None)
        if owner:
            out[n] = pids[owner]
    return out


def worker_env(backend, gates, args, tmp):
    """As torch's run_test.py sets up test_distributed_spawn (file:// init): TEMP_DIR with barrier/ and
    test_dir/, INIT_METHOD - distributed_test reads INIT_METHOD at import; setUp then makes per-case ones.
    TMPDIR: every temp file of the worker and its ranks lands under the driver's directory."""
    temp = os.path.join(tmp, "temp")
    for sub in ("barrier", "test_dir", "init_dir"):
        os.makedirs(os.path.join(temp, sub), exist_ok=True)
    return os.environ | {ENV_BACKEND: backend, ENV_GATES: gates, "TMPDIR": tmp, "TEMP_DIR": temp,
                         "INIT_METHOD": f"file://{temp}/init_dir/shared_init_file", "OMP_NUM_THREADS": "1",  # 2 cores
                         "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(int(args.timeout)),
                         ENV_SRC: args.src,
                         "PYTHONPATH": os.pathsep.join(filter(None, [args.src, os.environ.get("PYTHONPATH")]))}


def snapshot(tmp):
    """Copy the packages and this script once, so every rank of the run imports the same backend (and
    harness) while they are being edited: each rank is a fresh interpreter that re-imports them.
    Returns (the copy, the git state it was taken at)."""
    src = os.path.join(tmp, "src")
    for pkg in PACKAGES:
        shutil.copytree(os.path.join(REPO, pkg), os.path.join(src, pkg),
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(__file__, os.path.join(src, "torch_conformance.py"))
    git = lambda *a: subprocess.run(["git", "-C", REPO, *a], capture_output=True, text=True).stdout.strip()  # noqa
    dirty = git("status", "--porcelain", "--", *PACKAGES).splitlines()
    return src, f"{git('rev-parse', '--short', 'HEAD')}" + (f" + {len(dirty)} uncommitted files" if dirty else "")


def list_cases(backend, gates, args, tmp):
    env = worker_env(backend, gates, args, tmp) | {ENV_NOTES: tmp}
    out = subprocess.run([sys.executable, args.script, "--worker", "-"], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode:
        raise SystemExit(f"listing the {backend} cases failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


STOP, LIVE = threading.Event(), set()        # driver interrupted / workers running now


class Share:
    """What one worker thread of the driver learns: outcomes, rank processes (pid -> (case, start
    time), so a pid reused later by someone else is not taken for a rank), worker restarts and
    processes found left behind."""

    def __init__(self):
        self.results, self.ranks, self.restarts, self.stragglers = {}, {}, [], []


def _read_events(path, seen):
    """The worker's events past the first `seen` (whole lines only: it may be mid-write)."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return [], seen
    return [json.loads(line) for line in lines[seen:]], len(lines)


def run_share(backend, gates, cases, args, tmp, log, lock, share):
    """Run `cases` in a worker process, restarting it after a case that hung it (no end past
    --timeout + --grace), crashed it, or a stall outside any case (start-up, setUpClass, between
    cases: no event for as long). The case running at the time is failed with that verdict; the
    restarted worker goes on after it. A worker that gets no case done is not restarted again:
    what it had left is failed with the reason."""
    limit = args.timeout + args.grace
    remaining = list(cases)
    while remaining and not STOP.is_set():
        work = tempfile.mkdtemp(dir=tmp)
        notes, events, wanted = (os.path.join(work, n) for n in ("notes", "events", "cases"))
        os.mkdir(notes)
        with open(wanted, "w") as f:
            json.dump(remaining, f)
        env = worker_env(backend, gates, args, work) | {ENV_NOTES: notes, ENV_EVENTS: events}
        proc = subprocess.Popen([sys.executable, args.script, "--worker", wanted], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)   # own group: killpg
        LIVE.add(proc)
        seen, current, last, verdict, done = 0, None, time.time(), None, 0

        def take(evs):
            nonlocal current, last, done
            for ev in evs:
                last = ev["t"]
                if ev["event"] == "start":
                    current = ev["case"]
                elif ev["event"] == "pids":
                    share.ranks.update({p: (ev["case"], _start_time(p)) for p in ev["pids"]})
                else:
                    share.results[ev["case"]] = {k: ev[k] for k in ("outcome", "reason", "seconds")}
                    current, done = None, done + 1
                    progress(lock, backend, ev["case"], share.results[ev["case"]])

        while not STOP.is_set():
            exited = proc.poll() is not None            # before reading: every event it wrote is in
            evs, seen = _read_events(events, seen)
            take(evs)
            if exited:
                if current or proc.returncode:
                    verdict = f"the worker died (exit code {proc.returncode}; see the log)"
                break
            if time.time() - last > limit:
                verdict = f"hang: no end after {limit:.0f} s, killed by the runner" if current else \
                    f"the worker stalled outside any case for {limit:.0f} s, killed by the runner"
                break
            time.sleep(0.5)
        share.stragglers += kill_group(proc, share.ranks)
        take(_read_events(events, seen)[0])             # what it wrote while being stopped
        if verdict and not STOP.is_set():
            share.restarts.append({"case": current, "why": verdict, "cases_done": done})
            if current:
                share.results[current] = {"outcome": "failed", "reason": verdict, "seconds": time.time() - last}
                progress(lock, backend, current, share.results[current])
        left = [c for c in remaining if c not in share.results]
        if left and not done and not current and not STOP.is_set():   # it cannot get going: stop here
            why = verdict or f"the worker exited ({proc.returncode}) without running it"
            share.results |= {c: {"outcome": "failed", "reason": f"{why}; see the log", "seconds": 0.0} for c in left}
            left = []
        remaining = left
        shutil.rmtree(work, ignore_errors=True)
    return share


def progress(lock, backend, case, r):   # as the run goes, for whoever polls the output
    with lock:
        print(f"  [{backend}] {case}: {r['outcome']} ({r['seconds']:.1f} s)"
              + (f" - {r['reason']}" if r["outcome"] == "failed" else ""), flush=True)


def kill_group(proc, ranks) -> list:
    """SIGKILL what is left of a worker's process group (it, its rank processes and multiprocessing's
    helpers share it). Returns what was found left behind: members still there 5 s after the worker
    had exited on its own (multiprocessing's resource tracker leaves by itself within that), and any
    member that outlived the SIGKILL; each with its case when it was a rank."""
    found, deadline = [], time.time() + 5
    if proc.poll() is not None:
        while (found := _group(proc.pid)) and time.time() < deadline:
            time.sleep(0.2)
    report = [_describe(pid, ranks, "outlived its worker") for pid in found]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    LIVE.discard(proc)
    deadline = time.time() + 5
    while (alive := _group(proc.pid)) and time.time() < deadline:
        time.sleep(0.2)
    return report + [_describe(pid, ranks, "survived SIGKILL") for pid in alive]


def _describe(pid, ranks, what):
    case = ranks.get(pid, (None,))[0]
    return f"pid {pid} ({'rank process of ' + case if case else _cmdline(pid)[:100]}): {what}"


def _stat(pid):
    """(state, process group, start time in clock ticks) from /proc/PID/stat, or None once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[2]), int(fields[19])


def _start_time(pid):
    st = _stat(pid)
    return st and st[2]


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ").strip()
    except OSError:
        return "?"


def _group(pgid):
    """Live (not zombie) members of a process group."""
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if (st := _stat(pid)) and st[0] != "Z" and st[1] == pgid]


def run_backend(backend, gates, args, tmp, lock):
    log_path = os.path.join(os.path.dirname(args.out), f"torch_conformance_{label(backend, gates)}.log")
    t0 = time.time()
    cases = [c for c in select(list_cases(backend, gates, args, tmp), args.k) if args.only is None or c in args.only]
    shares = [Share() for _ in range(args.jobs)]
    with open(log_path, "w") as log:
        pool = ThreadPoolExecutor(args.jobs)
        try:
            list(pool.map(lambda i: run_share(backend, gates, cases[i::args.jobs], args, tmp, log, lock, shares[i]),
                          range(args.jobs)))
        except BaseException:                        # Ctrl-C / SIGTERM: no worker may outlive the driver
            STOP.set()
            raise
        finally:
            for proc in list(LIVE):
                kill_group(proc, {})
            pool.shutdown()
    ranks = {pid: v for s in shares for pid, v in s.ranks.items()}
    leaked = shm_of({pid: case for pid, (case, _) in ranks.items()})   # e.g. of ranks killed mid-collective
    for name in leaked:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass
    # a rank that left its worker's group (setsid) escapes killpg: the same pid, started at the same tick
    escaped = [f"pid {pid} (rank process of {case})" for pid, (case, start) in ranks.items()
               if start is not None and (st := _stat(pid)) and st[0] != "Z" and st[2] == start]
    return {"results": dict(sorted(c_r for s in shares for c_r in s.results.items())),
            "seconds": time.time() - t0, "log": log_path, "restarts": [r for s in shares for r in s.restarts],
            "shm_removed": sorted(f"{case}: {n}" for n, case in leaked.items()),
            "stragglers_killed": [x for s in shares for x in s.stragglers], "ranks_alive": escaped}


def label(backend, gates):
    return backend if gates == "own" or backend == "gloo" else f"{backend}_gates_as_gloo"


def counts(run):
    outs = [r["outcome"] for r in run["results"].values()]
    return {k: outs.count(k) for k in ("passed", "failed", "skipped")}


def summary(name, run):
    return f"{name}: " + ", ".join(f"{n} {k}" for k, n in counts(run).items()) + f" ({run['seconds']:.0f} s)"


def report(runs, gloo, gloo_source, args, command):
    """The Markdown: table, then hccl_sim's failures and skips by reason, then gloo passes it misses."""
    md = ["# torch.distributed conformance: hccl_sim vs gloo", "",
          f"`{command}` - torch {version('torch')}, WORLD_SIZE={WORLD_SIZE}, INIT_METHOD=file://, "
          f"per-case timeout {args.timeout:.0f} s, {time.strftime('%Y-%m-%d %H:%M')}, packages as of {args.source}, "
          f"load average at the end {os.getloadavg()[1]:.1f} (5 min; the machine has 2 cores)", "",
          "| backend | passed | failed | skipped | time |", "|---|---:|---:|---:|---:|"]
    for name, run in runs.items():
        c = counts(run)
        md.append(f"| {name} | {c['passed']} | {c['failed']} | {c['skipped']} | {run['seconds']:.0f} s |")
    for name, run in runs.items():
        if name == "gloo":
            continue
        for outcome in ("failed", "skipped"):
            by_reason = {}
            for case, r in run["results"].items():
                if r["outcome"] == outcome:
                    by_reason.setdefault(re.sub(r"^rank \d+: ", "", r["reason"] or ""), []).append(case)
            md += ["", f"## {name}: {outcome} ({sum(map(len, by_reason.values()))}), by reason", ""]
            for reason, cases in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                md.append(f"- **{reason}** ({len(cases)}): " + ", ".join(f"`{c}`" for c in cases))
        if gloo:
            passed = [c for c, r in gloo["results"].items() if r["outcome"] == "passed" and c in run["results"]]
            missed = [c for c in passed if run["results"][c]["outcome"] != "passed"]   # (over the cases -k ran)
            md += ["", f"## gloo passes, {name} does not ({len(missed)} of gloo's {len(passed)}; "
                   f"{len(passed) - len(missed)} pass on both)", "", f"gloo's outcomes: {gloo_source}", "",
                   "| case | outcome | reason |", "|---|---|---|"]
            for c in missed:
                r = run["results"][c]
                md.append(f"| `{c}` | {r['outcome']} | {(r['reason'] or '').replace('|', '/')} |")
    md += ["", "## Worker restarts, and what was left behind (found and removed by the runner)", ""]
    for name, run in runs.items():
        md.append(f"- {name}: {len(run['restarts'])} worker restarts, {len(run['shm_removed'])} /dev/shm segments "
                  f"of rank processes, {len(run['stragglers_killed'])} processes left by a worker, "
                  f"{len(run['ranks_alive'])} rank processes alive at the end; log {run['log']}")
        md += [f"  - restart: {r['why']}" + (f" in `{r['case']}`" if r["case"] else f" after {r['cases_done']} cases")
               for r in run["restarts"]]
        md += [f"  - {x}" for x in run["shm_removed"][:20] + run["stragglers_killed"] + run["ranks_alive"]]
    return "\n".join(md) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("hccl_sim", "gloo", "both"), default="both")
    ap.add_argument("--gates-as-gloo", action="store_true", help="decide the suite's gates as for gloo (docstring)")
    ap.add_argument("-k", help="select cases: substring / regex, or `a and not b` as pytest")
    ap.add_argument("--timeout", type=float, default=120.0, help="per case, seconds")
    ap.add_argument("--grace", type=float, default=90.0,
                    help="seconds beyond --timeout before the runner kills a worker that is stuck (the suite's own "
                    "kill, its traceback dump and the ranks' start-up come first)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", help="Markdown table (default experiments/out/torch_conformance[_gates_as_gloo].md)")
    ap.add_argument("--json", help="per-case outcomes (default: next to --out)")
    ap.add_argument("--gloo-results", default=os.path.join(REPO, "experiments/out/torch_conformance.json"),
                    help="gloo's outcomes from an earlier run's JSON when gloo is not run now")
    ap.add_argument("--gloo-passes", action="store_true",
                    help="run only the cases gloo passed in --gloo-results (with -k: those of them it selects)")
    ap.add_argument("--worker", metavar="CASES", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    gates = "gloo" if args.gates_as_gloo else "own"
    stem = "torch_conformance" + ("_gates_as_gloo" if args.gates_as_gloo else "")
    args.out = os.path.abspath(args.out or os.path.join(REPO, "experiments", "out", stem + ".md"))
    args.json = args.json or os.path.splitext(args.out)[0] + ".json"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # so the cleanup below runs
    args.only = None
    if args.gloo_passes:
        try:
            with open(args.gloo_results) as f:
                gloo_run = json.load(f)["runs"]["gloo"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"--gloo-passes: {args.gloo_results} is not a run of this script with a gloo backend "
                     f"({type(exc).__name__}: {exc})")
        args.only = {c for c, r in gloo_run["results"].items() if r["outcome"] == "passed"}
    backends = ["hccl_sim", "gloo"] if args.backend == "both" else [args.backend]
    command = "python " + " ".join([os.path.relpath(__file__, os.getcwd())] + sys.argv[1:])
    shm_before = set(os.listdir("/dev/shm"))
    tmp, lock, runs = tempfile.mkdtemp(prefix="torch_conformance_"), threading.Lock(), {}
    try:
        args.src, args.source = snapshot(tmp)
        args.script = os.path.join(args.src, "torch_conformance.py")
        for backend in backends:
            name = label(backend, gates)
            print(f"{name}: running (packages as of {args.source}; log in {os.path.dirname(args.out)})", flush=True)
            runs[name] = run_backend(backend, gates, args, tmp, lock)
            print(summary(name, runs[name]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gloo, gloo_source = runs.get("gloo"), "this run"
    if gloo is None and os.path.exists(args.gloo_results):     # e.g. the full run's, for --gates-as-gloo
        with open(args.gloo_results) as f:
            earlier = json.load(f)
        gloo, gloo_source = earlier["runs"].get("gloo"), f"{os.path.relpath(args.gloo_results, REPO)} " \
            f"(`{earlier['command']}`)"
    with open(args.out, "w") as f:
        f.write(report(runs, gloo, gloo_source, args, command))
    with open(args.json, "w") as f:
        json.dump({"command": command, "timeout_s": args.timeout, "gates": gates, "source": args.source,
                   "runs": runs}, f, indent=1)
    new_shm = sorted(set(os.listdir("/dev/shm")) - shm_before)
    print(f"wrote {args.out} and {args.json}; /dev/shm entries new since the start: {new_shm or 'none'}")
    for name, run in runs.items():
        print(summary(name, run))


if __name__ == "__main__":
    sys.exit(main())
