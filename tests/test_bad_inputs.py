"""A table of bad or extreme inputs, each answered by an HcclError naming the problem, in seconds.

Every row of BAD is (id, call, HcclError code, a substring the message must contain); every row
of CLI is (argv, a substring of the one stderr line); the CLI must exit with status 2. The
accepted-input tests below pin what must keep working (numpy integers, 131,072-rank topologies
built without their graphs, exact times for transfers past int64 nanosecond-bytes).
"""
import json
import math
import time
import warnings

import numpy as np
import pytest

import hccl_sim
import topologies
from hccl_sim import HcclError
from hccl_sim.tools.cli import main
from hccl_sim.config.env import Config

pytestmark = pytest.mark.timeout(120)


def fullmesh(p=2, **kw):
    return hccl_sim.topology("fullmesh", ranks=p, **kw)


def on_ranks(fn, p=2, **kw):
    return lambda tmp: hccl_sim.run(fn, topology=fullmesh(p), **kw)


def ranktable_file(tmp, name, content):
    path = tmp / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def one_device_table(rank_id="0"):
    return {"version": "1.0", "status": "completed", "server_count": "1",
            "server_list": [{"server_id": "a", "device": [{"device_id": "0", "rank_id": rank_id}]}]}


INF, NAN = float("inf"), float("nan")
A2 = "atlas800t-a2"

# id, call (tmp path -> result), code, message substring
BAD = [
    # topologies: sizes that would hang or exhaust memory, and counts that are not counts
    ("servers 10**9", lambda t: hccl_sim.topology(A2, servers=10**9), "E_PARA", "over the limit of 131072"),
    ("fullmesh 2*10**6 ranks", lambda t: fullmesh(2 * 10**6), "E_PARA", "over the limit of 1048576 (topologies.MAX_RANKS)"),
    ("ring 10**30 ranks", lambda t: hccl_sim.topology("ring", ranks=10**30), "E_PARA", "MAX_RANKS"),
    ("servers=True", lambda t: hccl_sim.topology(A2, servers=True), "E_PARA", "got True (bool)"),
    ("servers=np.True_", lambda t: hccl_sim.topology(A2, servers=np.bool_(True)), "E_PARA", "(bool)"),
    ("servers=2.0", lambda t: hccl_sim.topology(A2, servers=2.0), "E_PARA", "servers must be an integer"),
    ("servers='2'", lambda t: hccl_sim.topology(A2, servers="2"), "E_PARA", "got '2' (str)"),
    ("servers=-1", lambda t: hccl_sim.topology(A2, servers=-1), "E_PARA", "in [1, 131072], got -1"),
    ("servers=nan", lambda t: hccl_sim.topology(A2, servers=NAN), "E_PARA", "servers must be an integer"),
    ("ranks=0", lambda t: fullmesh(0), "E_PARA", "ranks must be an integer in [1, 1048576], got 0"),
    ("ranks=4.0", lambda t: fullmesh(4.0), "E_PARA", "got 4.0 (float)"),
    ("bandwidth='fast'", lambda t: fullmesh(8, bandwidth="fast"), "E_PARA", "bandwidth must be a number"),
    ("bandwidth=nan", lambda t: fullmesh(8, bandwidth=NAN), "E_PARA", "got nan"),
    ("bandwidth=1e-300", lambda t: fullmesh(8, bandwidth=1e-300), "E_PARA", ">= 1000"),
    ("bandwidth=True", lambda t: fullmesh(8, bandwidth=True), "E_PARA", "(bool)"),
    ("bandwidth=1j", lambda t: fullmesh(8, bandwidth=1j), "E_PARA", "(complex)"),
    ("latency=inf", lambda t: fullmesh(8, latency=INF), "E_PARA", "latency must be a number in [0, 1] s, got inf"),
    ("latency=1e300", lambda t: fullmesh(8, latency=1e300), "E_PARA", "got 1e+300"),
    ("latency=-1e-6", lambda t: fullmesh(8, latency=-1e-6), "E_PARA", "latency must be"),
    ("latency=nan", lambda t: fullmesh(8, latency=NAN), "E_PARA", "latency must be"),
    ("reduce_bandwidth=0", lambda t: fullmesh(8, reduce_bandwidth=0), "E_PARA", "reduce_bandwidth must be"),
    ("reduce_bandwidth=-inf", lambda t: fullmesh(8, reduce_bandwidth=-INF), "E_PARA", "reduce_bandwidth must be"),
    ("topology(None)", lambda t: hccl_sim.topology(None), "E_PARA", "expected a preset name"),
    ("topology('')", lambda t: hccl_sim.topology(""), "E_PARA", "unknown topology ''"),
    # rank tables
    ("rank_id '²'", lambda t: hccl_sim.topology(ranktable_file(t, "a.json", one_device_table("²"))), "E_PARA",
     "ASCII digits 0-9), got '²'"),
    ("rank_id 5000 digits", lambda t: hccl_sim.topology(ranktable_file(t, "b.json", one_device_table("9" * 5000))),
     "E_PARA", "is out of range"),
    ("rank table not UTF-8", lambda t: hccl_sim.topology(ranktable_file(t, "c.json", b'{"version": "\xff"}')),
     "E_PARA", "not UTF-8 text (byte 0xff"),
    ("rank table nested 10^5 deep", lambda t: hccl_sim.topology(ranktable_file(t, "d.json", "[" * 100000 + "]" * 100000)),
     "E_PARA", "nested too deeply"),
    ("rank table 5000-digit number", lambda t: hccl_sim.topology(ranktable_file(t, "e.json", "[" + "9" * 5000 + "]")),
     "E_PARA", "invalid JSON"),
    ("rank table preset='foo'", lambda t: hccl_sim.topology(ranktable_file(t, "f.json", one_device_table()), preset="foo"),
     "E_PARA", "unknown hardware preset 'foo'; expected one of atlas800t-a2, atlas800-910a"),
    ("rank table preset=[1]", lambda t: hccl_sim.topology(ranktable_file(t, "g.json", one_device_table()), preset=[1]),
     "E_PARA", "unknown hardware preset [1]"),
    # simulate
    ("simulate nbytes=True", lambda t: hccl_sim.simulate("allreduce", True), "E_PARA", "nbytes must be a non-negative integer, got True (bool)"),
    ("simulate nbytes=8.0", lambda t: hccl_sim.simulate("allreduce", 8.0), "E_PARA", "got 8.0 (float)"),
    ("simulate nbytes='8'", lambda t: hccl_sim.simulate("allreduce", "8"), "E_PARA", "got '8' (str)"),
    ("simulate root='0'", lambda t: hccl_sim.simulate("broadcast", 1024, root="0"), "E_PARA", "root must be an integer in [0, 7], got '0'"),
    ("simulate root=1.5", lambda t: hccl_sim.simulate("broadcast", 1024, root=1.5), "E_PARA", "got 1.5 (float)"),
    ("simulate root=True", lambda t: hccl_sim.simulate("reduce", 1024, root=True), "E_PARA", "(bool)"),
    ("simulate root=8", lambda t: hccl_sim.simulate("reduce", 1024, root=8), "E_PARA", "in [0, 7], got 8"),
    ("simulate root='x' allreduce", lambda t: hccl_sim.simulate("allreduce", 8, root="x"), "E_PARA", "root must be an integer"),
    ("simulate algo=3", lambda t: hccl_sim.simulate("allreduce", 8, algo=3), "E_PARA", "algo must be a string"),
    ("simulate dtype=None", lambda t: hccl_sim.simulate("allreduce", 8, dtype=None), "E_PARA", "unsupported data type None"),
    ("simulate trace='yes'", lambda t: hccl_sim.simulate("allreduce", 8, trace="yes"), "E_PARA", "trace must be True or False"),
    ("simulate policy=['hccl']", lambda t: hccl_sim.simulate("allreduce", 8, policy=["hccl"]), "E_PARA", "policy ['hccl'] is invalid"),
    ("simulate alltoall 4096 ranks", lambda t: hccl_sim.simulate("alltoall", 1 << 20, topology=hccl_sim.topology(A2, servers=512)),
     "E_PARA", "MAX_ALLTOALL_RANKS"),
    # env=
    ("env=[...]", lambda t: hccl_sim.simulate("allreduce", 8, env=["HCCL_BUFFSIZE=1"]), "E_PARA", "env must be a dict"),
    ("env='...'", on_ranks(lambda c: 1, env="HCCL_BUFFSIZE=1"), "E_PARA", "env must be a dict"),
    ("env key 1", lambda t: Config.from_env({1: "2"}), "E_PARA", "key 1 (int) is not a variable name"),
    ("env value int", lambda t: Config.from_env({"HCCL_BUFFSIZE": 1}), "E_PARA", "HCCL_BUFFSIZE=1 (int) must be a string"),
    ("env value None", lambda t: Config.from_env({"HCCL_ALGO": None}), "E_PARA", "must be a string"),
    ("HCCL_BUFFSIZE 5000 digits", lambda t: Config.from_env({"HCCL_BUFFSIZE": "9" * 5000}), "E_PARA", "HCCL_BUFFSIZE"),
    ("HCCL_BUFFSIZE Arabic-Indic 3", lambda t: Config.from_env({"HCCL_BUFFSIZE": "\u0663"}), "E_PARA", "an integer in [1, 1048576]"),
    ("HCCL_OP_RETRY_PARAMS 30 digits", lambda t: Config.from_env({"HCCL_OP_RETRY_PARAMS": "MaxCnt:" + "1" * 30}),
     "E_PARA", "HCCL_OP_RETRY_PARAMS"),
    ("HCCL_EXEC_TIMEOUT=-1", lambda t: Config.from_env({"HCCL_EXEC_TIMEOUT": "-1"}), "E_PARA", "HCCL_EXEC_TIMEOUT"),
    # run / Cluster
    ("run fn=None", lambda t: hccl_sim.run(None), "E_PARA", "fn must be callable"),
    ("run args=5", on_ranks(lambda c, a: a, args=5), "E_PARA", "args must be a tuple"),
    ("run kwargs=[1]", on_ranks(lambda c: 1, kwargs=[1]), "E_PARA", "kwargs must be a dict"),
    ("run local 8192 ranks", lambda t: hccl_sim.run(lambda c: 1, topology=hccl_sim.topology(A2, servers=1024)),
     "E_PARA", "MAX_LOCAL_RANKS"),
    ("Cluster data_plane='nope'", lambda t: hccl_sim.Cluster(fullmesh(2), data_plane="nope"), "E_PARA", "data_plane 'nope'"),
]

# on the local engine's ranks: the Communicator checks every argument on the calling rank, before the rendezvous
BAD_ON_RANKS = [
    ("send tag=[1]", on_ranks(lambda c: c.send(np.ones(2), 1, tag=[1]) if c.rank == 0 else c.recv(0)),
     "E_PARA", "tag must be an integer in [0, 2147483647], got [1] (list)"),
    ("recv tag=[1] on one rank", on_ranks(lambda c: c.send(np.ones(2), 1) if c.rank == 0 else c.recv(0, tag=[1])),
     "E_PARA", "tag must be an integer"),
    ("send tag=-1", on_ranks(lambda c: c.send(np.ones(2), 1, tag=-1) if c.rank == 0 else c.recv(0)),
     "E_PARA", "got -1 (int)"),
    ("send tag=True", on_ranks(lambda c: c.send(np.ones(2), 1, tag=True) if c.rank == 0 else c.recv(0)),
     "E_PARA", "got True (bool)"),
    ("algo=['ring'] on one rank", on_ranks(lambda c: c.all_reduce(np.ones(2), algo=["ring"] if c.rank == 0 else "ring")),
     "E_PARA", "algo must be a string"),
    ("algo=['ring'] on 1 of 1", on_ranks(lambda c: c.all_reduce(np.ones(2), algo=["ring"]), p=1), "E_PARA", "algo must be a string"),
    ("algo={} broadcast", on_ranks(lambda c: c.broadcast(np.ones(2), algo={})), "E_PARA", "algo must be a string"),
    ("stream=3", on_ranks(lambda c: c.all_gather(np.ones(2), stream=3)), "E_PARA", "stream must be a Stream"),
    ("broadcast root=1.0", on_ranks(lambda c: c.broadcast(np.ones(2), root=1.0)), "E_PARA",
     "root must be an integer in [0, 1], got 1.0 (float)"),
    ("broadcast root=None", on_ranks(lambda c: c.broadcast(np.ones(2), root=None)), "E_PARA", "root must be an integer"),
    ("send dst='1'", on_ranks(lambda c: c.send(np.ones(2), "1")), "E_PARA", "dst must be a rank"),
    ("all_reduce of bools", on_ranks(lambda c: c.all_reduce(np.ones(2, dtype=bool))), "E_PARA", "unsupported data type"),
    ("all_reduce result of 4 TiB", on_ranks(lambda c: c.all_reduce(np.broadcast_to(np.float32(1), (1 << 40,)))),
     "E_MEMORY", "no host memory for the op's"),
    ("alltoall on 1024 real ranks", lambda t: hccl_sim.run(lambda c: c.all_to_all(np.ones(1024)),
                                                           topology=hccl_sim.topology(A2, servers=128)),
     "E_PARA", "max_ranks_with_data"),
]


@pytest.mark.parametrize("call,code,message", [pytest.param(*row[1:], id=row[0], marks=pytest.mark.unit) for row in BAD]
                         + [pytest.param(*row[1:], id=row[0], marks=pytest.mark.local) for row in BAD_ON_RANKS])
def test_bad_input(call, code, message, tmp_path):
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        with pytest.raises(HcclError) as info:
            call(tmp_path)
    assert info.value.code == code
    assert message in str(info.value)
    assert time.monotonic() - t0 < 30


CLI = [
    (["bench", "-f", "0"], "-f must be an integer multiplication factor >= 2"),
    (["bench", "-f", "1"], "-f must be an integer multiplication factor >= 2"),
    (["bench", "-i", "0"], "-i 0: the increment must be at least 1 byte"),
    (["bench", "-f", "2", "-i", "1K"], "not both"),
    (["bench", "-b", "0", "-e", "64M", "-i", "1"], "MAX_SIZES"),
    (["bench", "-b", "²"], "is not a byte count"),
    (["bench", "-e", "9" * 5000], "is not a byte count"),
    (["bench", "-n", "1000000000"], "MAX_ITERS"),
    (["bench", "-c", "2"], "-c 2: expected 1"),
    (["bench", "-e", "1T"], "hccl_sim.tools.bench.HOST_MEMORY_FRACTION"),
    (["bench", "--servers", "200"], "MAX_LOCAL_RANKS"),
    (["bench", "--servers", "1000000000"], "over the limit of 131072"),
    (["bench", "--topology", "fullmesh", "--ranks", "2000000"], "topologies.MAX_RANKS"),
    (["bench", "--topology", "fullmesh", "--ranks", "8", "--latency", "inf"], "latency must be a number in [0, 1] s"),
    (["bench", "--topology", "fullmesh", "--ranks", "8", "--latency", "1e300"], "latency must be a number in [0, 1] s"),
    (["bench", "--topology", "fullmesh", "--ranks", "8", "--bandwidth", "nan"], "bandwidth must be a number"),
    (["bench", "--op", "alltoall", "--servers", "512", "--engine", "timing"], "MAX_ALLTOALL_RANKS"),
    (["bench", "--env", "HCCL_BUFFSIZE=abc"], "HCCL_BUFFSIZE"),
    (["bench", "--env", "=1"], "is not an HCCL_* variable"),
    (["topo", "--servers", "1000000000"], "over the limit of 131072"),
    (["topo", "fullmesh", "--ranks", "8", "--route", "0", "8"], "ranks must be in [0, 8)"),
    (["topo", "fullmesh", "--ranks", "8", "--bandwidth", "-1"], "bandwidth must be a number"),
]


@pytest.mark.unit
@pytest.mark.parametrize("argv,message", CLI, ids=[" ".join(a)[:60] for a, _ in CLI])
def test_cli_bad_input(capsys, argv, message):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("hccl-sim: error:") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and out == ""


@pytest.mark.unit
@pytest.mark.parametrize("name,table", [("rank_id.json", one_device_table("²")),
                                        ("nested.json", "[" * 100000 + "]" * 100000),
                                        ("binary.json", b"\xff\xfe\x00")])
def test_cli_bad_rank_table(capsys, tmp_path, name, table):
    code = main(["topo", ranktable_file(tmp_path, name, table)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hccl-sim: error:") and len(err.strip().splitlines()) == 1
    assert "rank table" in err


@pytest.mark.unit
def test_cli_warns_misspelt_variable_in_one_line(capsys):
    assert main(["bench", "--engine", "timing", "-e", "64", "--env", "HCCL_BUFSIZE=1"]) == 0
    err = capsys.readouterr().err
    assert err.strip() == "hccl-sim: warning: env: unknown HCCL variable HCCL_BUFSIZE is ignored; did you mean HCCL_BUFFSIZE?"


@pytest.mark.local
def test_misspelt_env_variable_warns_naming_the_closest():
    with pytest.warns(UserWarning, match="HCCL_BUFSIZE is ignored; did you mean HCCL_BUFFSIZE"):
        hccl_sim.run(lambda c: 1, topology=fullmesh(2), env={"HCCL_BUFSIZE": "1"})
    with pytest.warns(UserWarning, match="did you mean HCCL_EXEC_TIMEOUT"):
        hccl_sim.simulate("allreduce", 8, env={"HCCL_EXEC_TIMEOUTS": "5"})
    with pytest.warns(UserWarning, match="HCCL_IF_IP is an HCCL variable that hccl-sim does not model"):
        Config.from_env({"HCCL_IF_IP": "10.0.0.1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Config.from_env({"HCCL_BUFFSIZE": "1"})          # a known variable: no warning


@pytest.mark.local
def test_numpy_integers_are_integers():
    topo = hccl_sim.topology(A2, servers=np.int64(2))
    assert topo.num_ranks == 16 and hccl_sim.topology("ring", ranks=np.int32(3)).num_ranks == 3
    est = hccl_sim.simulate("broadcast", np.int64(1 << 20), topology=topo, root=np.uint8(9))
    assert est.nbytes == 1 << 20 and est.time == hccl_sim.simulate("broadcast", 1 << 20, topology=topo, root=9).time

    def fn(c):
        y = c.broadcast(np.ones(2) * c.rank, root=np.int64(1))
        if c.rank == 0:
            c.send(y, np.int64(1), tag=np.int16(4))
            return y
        return c.recv(np.int64(0), tag=np.int64(4))
    assert [list(r) for r in hccl_sim.run(fn, topology=fullmesh(2))] == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.unit
def test_large_topologies_are_built_without_their_graphs():
    """16,384 servers and a 1,048,576-rank full mesh well under two seconds; graphs only when asked for."""
    t0 = time.perf_counter()
    big = hccl_sim.topology(A2, servers=16384)
    mesh = hccl_sim.topology("fullmesh", ranks=topologies.MAX_RANKS)
    assert time.perf_counter() - t0 < 2.0
    assert big.num_ranks == 131072 and "graph" not in repr(big)
    assert big.links_by_kind() == {"HCCS": (16384 * 28, {19.5e9}), "RoCE": (131072, {20.73e9})}
    assert mesh.links_by_kind()["link"][0] == topologies.MAX_RANKS * (topologies.MAX_RANKS - 1) // 2
    assert mesh.route(5, 131071).latency_ns == 5000
    small = hccl_sim.topology("atlas800-910a", servers=2)
    counted = small.links_by_kind()
    assert small.graph.number_of_edges() == sum(n for n, _ in counted.values())
    assert small.links_by_kind() == counted       # now counted from the built graph


@pytest.mark.unit
def test_fullmesh_of_many_ranks_simulates_without_a_p_squared_table():
    est = hccl_sim.simulate("allreduce", 1 << 20, topology=fullmesh(16384))
    assert est.algo == "H-D_R" and 0 < est.time < 1e-3


@pytest.mark.unit
def test_transfers_past_int64_nanosecond_bytes_are_exact():
    """64 GiB in one transfer: nbytes * 1e9 leaves int64; it used to come out negative."""
    from topologies.model import transfer_ns, transfer_ns_array
    n = 1 << 36
    assert transfer_ns_array(np.array([n, 1 << 20]), 25e9).tolist() == [transfer_ns(n, 25e9), transfer_ns(1 << 20, 25e9)]
    topo = fullmesh(2)
    env = {"HCCL_BUFFSIZE": "1048576"}
    for m in (1 << 34, 1 << 36):     # ring AllReduce, p = 2: 2(p-1) alpha + 2(p-1)/p n beta (one buffer loop)
        est = hccl_sim.simulate("allreduce", m, topology=topo, env=env, algo="ring")
        assert est.time == pytest.approx(2 * 5e-6 + m / 25e9, abs=2e-9)


# Every rooted collective checks its root the same way on both paths (Collective.checked_root): a
# root past the last rank is E_PARA naming the root, never an IndexError from the schedule.
ROOTED = [name for name, c in hccl_sim.collectives.COLLECTIVES.items() if c.rooted]


@pytest.mark.unit
def test_rooted_collectives_are_listed():
    assert {"broadcast", "reduce", "scatter"} <= set(ROOTED)


@pytest.mark.unit
@pytest.mark.parametrize("op", ROOTED)
@pytest.mark.parametrize("root", [99, -1, 8])
def test_simulate_bad_root_of_every_rooted_op(op, root):
    topo = hccl_sim.topology(A2, servers=1)
    with pytest.raises(HcclError) as e:
        hccl_sim.simulate(op, 1 << 20, topology=topo, root=root)
    assert e.value.code == "E_PARA"
    assert f"root must be an integer in [0, 7], got {root}" in str(e.value)


@pytest.mark.local
@pytest.mark.parametrize("op", ROOTED)
def test_run_bad_root_of_every_rooted_op(op):
    method = hccl_sim.collectives.of(op).method

    def call(comm):
        return getattr(comm, method)(np.ones(8, dtype=np.float32), root=99)
    with pytest.raises(HcclError) as e:
        hccl_sim.run(call, topology=fullmesh(2))
    assert e.value.code == "E_PARA"
    assert "root must be an integer in [0, 1], got 99" in str(e.value)
