"""The MPI engine under real `mpiexec -n 2/3/4` jobs (scripts in tests/mpi_scripts/): results
against numpy, simulated times against the local engine, failures on every process without a
hang, ranks per process > 1, rank tables, hccl_test's output, a retried fault, a crashed rank
(as the local engine: None for it, the survivors' errors, clocks and shrunk communicator). Each
job has a timeout, and leaves no process and nothing in /dev/shm behind."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hccl_sim
from conftest import mapped_outside

import mpi4py  # noqa: F401,E402 - declared dependencies (mpi4py, the mpich wheel's mpiexec): never skipped
MPIEXEC = shutil.which("mpiexec") or "mpiexec"    # missing, the launches fail and say so

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "mpi_scripts"
ROOT = HERE.parent


def mpiexec(n, *argv, timeout=90, expect_rc=0):
    """Run `mpiexec -n n python argv...` (a script of mpi_scripts, or -m hccl_sim); its stdout
    lines and stderr. Processes' lines may interleave: tests that read every process's lines find
    them with oks() / said()."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = set(os.listdir("/dev/shm"))
    cmd = [MPIEXEC, "-n", str(n), sys.executable] + [str(a) for a in argv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert out.returncode == expect_rc, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    left = [name for name in set(os.listdir("/dev/shm")) - before if name.startswith("mpich") and not mapped_outside(name)]
    assert not left, f"MPI shared memory left behind: {left}"
    return out.stdout.splitlines(), out.stderr



def oks(lines) -> list:
    return sorted(int(m) for m in re.findall(r"OK (\d+)", "\n".join(lines)))


def said(lines, what) -> list:
    return sorted(int(m) for m in re.findall(rf"{what} (\d+)", "\n".join(lines)))


@pytest.mark.mpi
def test_every_collective_on_three_processes_both_planes_results_equal_numpy_op_clocks_equal_local():
    lines, _ = mpiexec(3, SCRIPTS / "collectives.py", 1, "p2p,window")
    assert oks(lines) == [0, 1, 2]


@pytest.mark.mpi
def test_two_processes_of_three_ranks_each():
    lines, _ = mpiexec(2, SCRIPTS / "collectives.py", 3, "p2p,window")
    assert oks(lines) == [0, 1]


@pytest.mark.mpi
def test_four_processes_point_to_point_plane():
    lines, _ = mpiexec(4, SCRIPTS / "collectives.py", 1, "p2p")
    assert oks(lines) == [0, 1, 2, 3]


@pytest.mark.mpi
def test_one_node_defaults_to_the_window_plane_and_p2p_is_forced():
    """No data_plane: every process on this node, so run() and init() run on "window" on every
    rank (comm.data_plane); data_plane="p2p" forces point to point (mpi_scripts/planes.py)."""
    lines, _ = mpiexec(2, SCRIPTS / "planes.py", 1)
    assert oks(lines) == [0, 1]
    lines, _ = mpiexec(2, SCRIPTS / "planes.py", 2)
    assert oks(lines) == [0, 1]


class _Comm:
    """A stand-in for an MPI communicator: `size` processes, `node` of them on this one's node."""

    def __init__(self, size, node):
        self.size, self.node, self.freed = size, node, 0

    def Get_size(self):
        return self.size

    def Split_type(self, kind):
        return _Node(self)


class _Node:
    def __init__(self, comm):
        self.comm = comm

    def Get_size(self):
        return self.comm.node

    def Free(self):
        self.comm.freed += 1


@pytest.mark.unit
@pytest.mark.parametrize("size, node, want", [(4, 4, "window"), (4, 2, "p2p"), (2, 1, "p2p"), (1, 1, "window")])
def test_default_plane_is_window_only_when_the_whole_job_shares_a_node(size, node, want):
    from hccl_sim.engines.mpi import default_plane
    comm = _Comm(size, node)
    assert default_plane(comm) == want and comm.freed == 1


@pytest.mark.mpi
def test_mismatch_raising_rank_early_return_and_rank_crash_on_every_process():
    """crash: a fault plan's rank_crash (on entry, mid-op on both planes, in an eager op) gives what
    the local engine gives, each survivor woken by the dead rank's loss (failures.crashes)."""
    lines, _ = mpiexec(3, SCRIPTS / "failures.py", 1)
    # aborting: comm.abort() releases the others; own_bug: a rank's own error over a peer's early return
    for what in ("mismatched", "raising", "early", "own_bug", "late", "aborting"):
        assert said(lines, what) == [0, 1, 2], lines
    assert said(lines, "crash") == [0, 1, 2], lines


@pytest.mark.mpi
def test_failures_and_rank_crash_with_two_ranks_per_process():
    lines, _ = mpiexec(2, SCRIPTS / "failures.py", 2)
    for what in ("mismatched", "raising", "early", "own_bug", "late", "aborting", "crash"):
        assert said(lines, what) == [0, 1], lines


@pytest.mark.mpi
def test_rank_table_maps_ranks_in_order_and_a_mismatch_names_both_sizes(tmp_path):
    table = tmp_path / "rt16.json"
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    from topologies import ranktable
    ranktable.save(topo, table)
    lines, _ = mpiexec(4, SCRIPTS / "ranktable.py", table, 4, "ok")
    seen = {int(r): (int(s), int(d)) for r, s, d in re.findall(r"RANK (\d+) server (\d+) device (\d+)", "\n".join(lines))}
    assert seen == {r: (topo.server_of[r], topo.device_of[r]) for r in range(16)}
    lines, _ = mpiexec(3, SCRIPTS / "ranktable.py", table, 1, "mismatch")
    mism = re.findall(r"MISMATCH \d+ [^\n]*?(?=MISMATCH|\n|$)", "\n".join(lines))
    assert len(mism) == 3 and all("16 ranks" in m and "3 processes" in m for m in mism), mism


@pytest.mark.mpi
def test_bench_hccl_test_format_prints_once_with_hccl_test_columns():
    lines, _ = mpiexec(2, "-m", "hccl_sim", "bench", "--engine", "mpi", "--format", "hccl_test", "--op", "allgather",
                       "--topology", "fullmesh", "-b", "8K", "-e", "128K", "-f", "4", "-d", "int32", "-n", "2", "-w", "1",
                       "-c", "1", "-p", "2", "-z", "0")
    assert lines[0] == "the minbytes is 8192, maxbytes is 131072, iters is 2, warmup_iters is 1"
    # hccl_opbase_rootinfo_base.cc print_execution_time (oam-tools ea0ce91): the header and row formats
    assert lines[1] == "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:"
    rows = [[cell.strip() for cell in line.split("|")] for line in lines[2:]]
    assert [int(r[0]) for r in rows] == [8192, 32768, 131072] and all(r[3] == "success" for r in rows)
    for r in rows:      # all_gather_test: data_size is the whole output, alg_bandwidth data_size / time
        assert float(r[2]) == pytest.approx(int(r[0]) / float(r[1]) / 1e3, rel=2e-3)


@pytest.mark.mpi
def test_bench_nccl_table_on_mpi_and_refused_hccl_test_flags():
    lines, _ = mpiexec(2, "-m", "hccl_sim", "bench", "--engine", "mpi", "--topology", "fullmesh", "-b", "1K",
                       "-e", "256K", "-f", "16", "-n", "1", "-w", "0")
    assert sum(line.startswith("# Out of bounds values : 0 OK") for line in lines) == 1
    assert lines[0].endswith("engine mpi, data plane window"), lines[0]     # one node: the shared windows
    lines, _ = mpiexec(2, "-m", "hccl_sim", "bench", "--engine", "mpi", "--topology", "fullmesh", "-b", "256K",
                       "-e", "256K", "-n", "1", "-w", "0", "--data-plane", "p2p")
    assert lines[0].endswith("engine mpi, data plane p2p") and "# Out of bounds values : 0 OK" in lines, lines
    # refusals need no job: one process (an MPI singleton)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for argv, words in ((["--format", "hccl_test", "-z", "1"], "zero-copy"),
                        (["--topology", "fullmesh", "-p", "8"], "-p 8: the topology has [1] NPUs per server")):
        out = subprocess.run([sys.executable, "-m", "hccl_sim", "bench", "--engine", "mpi"] + argv,
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.mpi
def test_train_under_mpiexec_prints_once_and_step_losses_and_times_equal_local(tmp_path):
    """hccl-sim train --engine mpi on 3 processes (the 910B preset filled to 3 NPUs): rank 0 alone
    prints; every step's loss and simulated times are the local engine's, to the nanosecond."""
    from threadpoolctl import threadpool_limits
    import topologies
    from hccl_sim.training import TrainConfig, report, train_rank
    js = tmp_path / "train.json"
    lines, _ = mpiexec(3, "-m", "hccl_sim", "train", "--engine", "mpi", "--steps", "3", "--hidden", "32",
                       "--batch", "60", "--json", js)
    assert sum(line.startswith("# hccl-sim train") for line in lines) == 1, lines
    assert "3 ranks (atlas800t-a2, 1 server, 910B), engine mpi" in lines[0]
    assert sum("bit-identical on every rank" in line for line in lines) == 1
    with threadpool_limits(limits=1, user_api="blas"):
        local = hccl_sim.run(train_rank, topology=topologies.presets.filled("atlas800t-a2", 3),
                             args=(TrainConfig(steps=3, hidden=32, batch=60),))
    import json
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]   # noqa: E731
    assert strip(json.loads(js.read_text())["steps"]) == strip(report.step_rows(local))


@pytest.mark.mpi
def test_link_flap_with_op_retry_sums_retries_and_end_clocks_equal_on_mpi_and_local():
    lines, _ = mpiexec(2, SCRIPTS / "fault_retry.py")
    assert oks(lines) == [0, 1]


@pytest.mark.unit
def test_settings_of_engine_mpi_are_refused_elsewhere():
    with pytest.raises(hccl_sim.HcclError, match="ranks_per_process"):
        hccl_sim.run(lambda comm: None, topology=hccl_sim.topology("fullmesh", ranks=2), ranks_per_process=2)
    with pytest.raises(hccl_sim.HcclError, match="Cluster"):
        hccl_sim.Cluster(hccl_sim.topology("fullmesh", ranks=2), engine="mpi")
