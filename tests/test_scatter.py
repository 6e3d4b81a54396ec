"""Scatter (HcclScatter): integer data against numpy for every rank count, root and algorithm,
HCCL's executors on every preset with their buffer loops, its selection and HCCL_ALGO's `scatter`
setting, closed forms on the synthetic full mesh, bench, faults and groups."""
import math

import numpy as np
import pytest

import hccl_sim
import topologies
from hccl_sim import FaultPlan, HcclError

from test_closed_forms import ITEM, LCM, A, B, makespan

FLAT = ("ring", "NHR", "NB", "fullmesh")


def _scatter(comm, root, algo, rows):
    p = comm.size
    x = (np.arange(p * rows * 2, dtype=np.int64).reshape(p * rows, 2) + (10_000 if comm.rank == root else 0))
    return comm.scatter(x, root=root, algo=algo), comm.last_op


def check(topo, root, algo=None, rows=3, env=None):
    p = topo.num_ranks
    want = np.split(np.arange(p * rows * 2, dtype=np.int64).reshape(p * rows, 2) + 10_000, p)
    got = hccl_sim.run(_scatter, topology=topo, args=(root, algo, rows), env=env)
    for r, ((y, _), w) in enumerate(zip(got, want)):
        assert np.array_equal(y, w), f"{topo.name} root {root} {algo} rank {r}"
    return got[0][1]


@pytest.mark.local
@pytest.mark.parametrize("p", list(range(1, 17)))
def test_every_rank_count_root_and_flat_algorithm_equals_numpy(p):
    topo = hccl_sim.topology("fullmesh", ranks=p)
    for algo in FLAT:
        for root in sorted({0, p - 1, p // 2}):
            assert check(topo, root, algo).algo == algo


@pytest.mark.local
@pytest.mark.parametrize("name,params,algo", [
    ("atlas800t-a2", {"servers": 1}, "level0:fullmesh"),
    ("atlas800t-a2", {"servers": 2}, "level0:fullmesh;level1:ring"),
    ("atlas800-910a", {"servers": 2}, "level0:ring;level1:ring"),
    ("atlas900-a3", {"servers": 2}, "level0:ring;level1:ring"),
    ("atlas900-a3", {"superpods": 2, "servers": 1}, "level0:ring;level1:ring"),
], ids=str)
def test_hccls_executors_on_every_preset_with_buffer_loops(name, params, algo):
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    for root in (0, p - 1, (2 * p) // 3):
        assert check(topo, root).algo.startswith(algo)
        for token in ("NHR", "NB"):
            assert check(topo, root, f"level0:NA;level1:{token}").algo.startswith(algo.replace("level1:ring", f"level1:{token}"))
    rec = check(topo, 1, rows=30_000, env={"HCCL_BUFFSIZE": "1"})        # 480 KB blocks: several loops
    assert rec.algo.startswith(algo)


@pytest.mark.local
def test_unequal_servers_run_over_every_rank():
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 2])
    rec = check(topo, 5)
    assert rec.algo == "ring (servers with unequal card counts: HCCL's ScatterComm over every rank)"


@pytest.mark.unit
def test_selection_is_ring_unless_nhr_or_nb_and_follows_its_own_hccl_algo_key():
    topo = hccl_sim.topology("atlas800t-a2", servers=4)
    n = 32 << 20
    assert hccl_sim.simulate("scatter", n, topology=topo).algo == "level0:fullmesh;level1:ring"
    assert hccl_sim.simulate("scatter", n, topology=topo, algo="H-D_R").algo == \
        "level0:fullmesh;level1:ring (HCCL's Scatter runs level1 H-D_R as ring)"
    assert hccl_sim.simulate("scatter", n, topology=topo,
                             env={"HCCL_ALGO": "scatter=level0:NA;level1:NHR"}).algo == "level0:fullmesh;level1:NHR"
    assert hccl_sim.simulate("scatter", n, topology=topo,
                             env={"HCCL_ALGO": "broadcast=level0:NA;level1:NHR"}).algo == "level0:fullmesh;level1:ring"
    with pytest.raises(HcclError, match="accepted by HCCL but not built"):
        hccl_sim.simulate("scatter", n, topology=topo, algo="AHC")


@pytest.mark.unit
@pytest.mark.parametrize("p", list(range(2, 17)))
def test_closed_forms_on_the_synthetic_full_mesh(p):
    """Ring: the root sends one block a step, the farthest first, n - 1 steps: (p-1)(a + n/p b).
    Mesh: every block at once over links of their own: a + n/p b. NHR and NB: step s moves
    floor((p-1+2^s)/2^(s+1)) blocks per sender: sum_s (a + that n/p b)."""
    n = LCM * ITEM
    blk = n // p
    assert makespan("scatter", n, p, "ring", root=p // 2) == (p - 1) * (A + blk * B)
    assert makespan("scatter", n, p, "fullmesh", root=1) == A + blk * B
    tree = sum(A + ((p - 1 + (1 << s)) // (1 << (s + 1))) * blk * B for s in range(math.ceil(math.log2(p))))
    assert makespan("scatter", n, p, "NHR", root=0) == tree
    assert makespan("scatter", n, p, "NB", root=p - 1) == tree


@pytest.mark.local
def test_bench_scatter_on_real_data_equals_the_timing_engine(capsys):
    from hccl_sim.tools.cli import main
    args = ["bench", "--op", "scatter", "-b", "4K", "-e", "4M", "-f", "32", "--servers", "2", "-n", "2", "-r", "9"]
    assert main(args) == 0
    real = [line.split() for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    assert main(args + ["--engine", "timing"]) == 0
    timed = [line.split() for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    assert len(real) == 3 and [r[:8] + r[10:] for r in real] == [r[:8] + r[10:] for r in timed]
    assert all(r[8] == "0" for r in real) and all(r[4] == "9" for r in real)


@pytest.mark.local
@pytest.mark.parametrize("build", [lambda f: f.corrupt(0, 8), lambda f: f.link_slow(0, 8, factor=0.25)],
                         ids=["corrupt", "slow"])
def test_faults_leave_the_blocks_numpys_at_simulates_time(build):
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    got = hccl_sim.run(_scatter, topology=topo, args=(0, None, 3000), faults=build(FaultPlan()))
    want = np.split(np.arange(16 * 3000 * 2, dtype=np.int64).reshape(16 * 3000, 2) + 10_000, 16)
    assert all(np.array_equal(y, w) for (y, _), w in zip(got, want))
    est = hccl_sim.simulate("scatter", 16 * 3000 * 16, topology=topo, dtype="int64", faults=build(FaultPlan()))
    assert [rec.end - rec.start for _, rec in got] == [round(t * 1e9) for t in est.times]


@pytest.mark.local
def test_in_a_group_scatter_sorts_by_its_output_bytes():
    """calcOpDataVolume: Scatter's volume is its recvCount (one block), an AllReduce's its input."""
    def fn(comm):
        p = comm.size
        with comm.group():
            comm.scatter(np.zeros(100 * p, dtype=np.int32))       # 400 B per rank received
            comm.all_reduce(np.zeros(50, dtype=np.int32))         # 200 B
            comm.all_reduce(np.zeros(200, dtype=np.int32))        # 800 B
        return [(name, e - s) for name, s, e in comm.device.default_stream.tasks]
    for tasks in hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=4)):
        assert [t[0] for t in tasks] == ["all_reduce", "scatter", "all_reduce"]
