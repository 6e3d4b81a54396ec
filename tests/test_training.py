"""Data-parallel training (hccl_sim.training): DDP's bucket assignment; the loss curve and final
parameters equal single-process full-batch training for 1..8 ranks and every AllReduce algorithm
(parameters bit-identical across ranks); SyncBatchNorm's statistics are the whole batch's; a
bucket's AllReduce starts before backward ends and hides communication under compute; a link flap
mid-run is retried without changing the loss curve and a crash is survived by shrinking and
restoring the last checkpoint (both on local and Ray); the `hccl-sim train` command and its files."""
import json

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import hccl_sim
import topologies
from hccl_sim import FaultPlan, HcclError
from hccl_sim.tools.cli import main
from hccl_sim.training import TrainConfig, train_rank, train_reference
from hccl_sim.training import buckets as bk
from hccl_sim.training import report
from hccl_sim.training.data import Batches, load_digits, shard
from hccl_sim.training.layers import BatchNorm, softmax_cross_entropy
from hccl_sim.training.sync import Sync

SMALL = dict(steps=4, batch=120, hidden=48, checkpoint_every=2)
MIB = 1 << 20


def run(cfg, topo, **kw):
    with threadpool_limits(limits=1, user_api="blas"):
        return hccl_sim.run(train_rank, topology=topo, args=(cfg,), **kw)


def losses(results):
    return [row["loss"] for row in report.step_rows(results)]


def flat(topo_ranks):
    return hccl_sim.topology("fullmesh", ranks=topo_ranks, bandwidth=25e9, latency=5e-6)


@pytest.fixture(scope="module")
def reference():
    cfg = TrainConfig(**SMALL, keep_params=True)
    return cfg, train_reference(cfg)


def assert_equals_reference(results, ref, atol=2e-5):
    alive = [r for r in results if r is not None]
    assert len({r.digest for r in alive}) == 1                     # bit-identical on every rank
    rows = report.step_rows(results)          # a step redone after a recovery is compared again
    assert np.allclose([r["loss"] for r in rows], [ref["losses"][r["step"]] for r in rows], rtol=0, atol=atol)
    for name, want in ref["params"].items():
        assert np.allclose(alive[0].params[name], want, rtol=0, atol=10 * atol), name


# ---- pieces ----------------------------------------------------------------------------------------

@pytest.mark.unit
def test_ddp_bucket_assignment():
    """Reverse registration order; a parameter joins the bucket, which closes once it holds its
    cap (1 MiB for the first, the cap after); no cap: one bucket."""
    sizes = [4 * MIB, 4096, 512 * 1024, 600 * 1024, 100, 30 * MIB, 10]
    assert bk.assign(sizes, 25 * MIB) == [[6, 5], [4, 3, 2, 1, 0]]
    assert bk.assign(sizes, 1 * MIB) == [[6, 5], [4, 3, 2], [1, 0]]
    assert bk.assign(sizes, None) == [[6, 5, 4, 3, 2, 1, 0]]
    assert bk.assign([100, 200], 25 * MIB) == [[1, 0]]
    with pytest.raises(HcclError, match="bucket cap must be > 0"):
        bk.assign(sizes, 0)


@pytest.mark.unit
def test_batches_are_global_and_shards_cover_them():
    x, y = load_digits()
    assert x.shape == (1797, 64) and x.dtype == np.float32 and set(np.unique(y)) == set(range(10))
    assert np.allclose(x.mean(axis=0), 0, atol=1e-5)
    b = Batches(len(y), 256, seed=3)
    assert b.per_epoch == 7
    first = b.indices(0)
    assert len(first) == 256 and len(set(first)) == 256 and not np.array_equal(b.indices(7)[:256], first)
    for p in (1, 3, 7, 8):
        parts = [shard(first, r, p) for r in range(p)]
        assert np.array_equal(np.concatenate(parts), first) and max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(HcclError, match="batch must be an integer"):
        Batches(len(y), 0, 0)


@pytest.mark.unit
def test_softmax_cross_entropy_is_stable_and_exact():
    logits = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]], dtype=np.float32)
    total, grad, correct = softmax_cross_entropy(logits, np.array([0, 2]), scale=0.5)
    z = np.array([1.0, 2.0, 3.0])
    want = np.log(np.exp(z).sum()) - 3.0
    assert np.isfinite(total) and abs(total - want) < 1e-5 and correct == 2
    assert np.allclose(grad[0], 0) and np.allclose(grad[1], 0.5 * (np.exp(z) / np.exp(z).sum() - [0, 0, 1]), atol=1e-6)


def _syncbn_shard(comm, x):
    bn = BatchNorm("bn", x.shape[1])
    mine = shard(np.arange(len(x)), comm.rank, comm.size)
    y = bn.forward(x[mine], Sync(comm))
    dx = bn.backward(np.ones_like(y) * np.arange(y.shape[1], dtype=np.float32), Sync(comm))
    return y, dx, bn.running_mean, bn.running_var


@pytest.mark.local
def test_syncbn_statistics_are_the_whole_batchs():
    x = load_digits()[0][:101, :16] * 3 + 1
    full = BatchNorm("bn", 16)
    y = full.forward(x, Sync(None))
    dx = full.backward(np.ones_like(y) * np.arange(16, dtype=np.float32), Sync(None))
    for p in (2, 5):
        out = hccl_sim.run(_syncbn_shard, topology=flat(p), args=(x,))
        assert np.allclose(np.concatenate([o[0] for o in out]), y, atol=1e-5)
        assert np.allclose(np.concatenate([o[1] for o in out]), dx, atol=1e-5)
        for o in out:
            assert np.allclose(o[2], full.running_mean, atol=1e-6) and np.allclose(o[3], full.running_var, atol=1e-5)


# ---- data-parallel training equals the full batch -------------------------------------------------------

@pytest.mark.local
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_loss_and_parameters_equal_full_batch_training(p, reference):
    cfg, ref = reference
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[p])
    assert_equals_reference(run(cfg, topo), ref)


@pytest.mark.local
@pytest.mark.parametrize("algo", ["ring", "H-D_R", "NHR", "NB", "fullmesh"])
def test_every_allreduce_algorithm_and_deterministic_mode(algo, reference):
    cfg, ref = reference
    for env in ({}, {"HCCL_DETERMINISTIC": "true"}):
        got = run(TrainConfig(**SMALL, keep_params=True, algo=algo), flat(6), env=env)
        assert_equals_reference(got, ref)
        assert {a for r in got for s in r.steps for a in s.algos} == {algo}


@pytest.mark.local
def test_two_servers_hierarchical_allreduce(reference):
    cfg, ref = reference
    got = run(cfg, hccl_sim.topology("atlas800t-a2", servers=2))
    assert_equals_reference(got, ref)


# ---- buckets overlap backward ----------------------------------------------------------------------------

@pytest.mark.local
def test_buckets_overlap_backward_and_one_bucket_does_not():
    """hidden 1024: two buckets (fc3, bn2 and fc2 first). Bucket 0 leaves when fc2's gradients
    exist, before backward ends (bucket 1's launch), and hides under the rest of backward; one
    bucket for everything leaves only after backward, and the step takes longer."""
    topo = hccl_sim.topology("atlas800t-a2", servers=1)
    base = dict(steps=2, batch=256, hidden=1024)
    split = run(TrainConfig(**base), topo)
    whole = run(TrainConfig(**base, bucket_mb=None), topo)
    rec = split[0].steps[1]
    assert len(split[0].buckets) == 2 and len(whole[0].buckets) == 1
    (b0, ready0), (b1, ready1) = rec.launches
    assert (b0, b1) == (0, 1) and ready0 < ready1
    start0 = next(s for name, s, e in rec.ops if name == "bucket0")
    assert start0 < ready1                            # in flight while fc1/bn1 still run backward
    rows_split, rows_whole = report.step_rows(split), report.step_rows(whole)
    assert rows_split[1]["exposed_ns"] < rows_split[1]["comm_ns"]
    assert rows_split[1]["step_ns"] < rows_whole[1]["step_ns"]
    assert rows_split[1]["overlap"] > rows_whole[1]["overlap"]
    assert np.allclose(losses(split), losses(whole), atol=1e-5)     # the same sums, to float rounding


# ---- faults during training -----------------------------------------------------------------------------

@pytest.mark.local
def test_link_flap_mid_run_is_retried_and_changes_no_loss(reference):
    cfg, ref = reference
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    clean = run(cfg, topo)
    t1 = report.step_rows(clean)[1]["start_ns"] / 1e9
    plan = FaultPlan().link_flap(0, 8, at=t1, duration=1e-3)
    env = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1", "HCCL_OP_RETRY_ENABLE": "L1:1",
           "HCCL_OP_RETRY_PARAMS": "MaxCnt:3,HoldTime:1,IntervalTime:1"}
    got = run(cfg, topo, faults=plan, env=env)
    rows = report.step_rows(got)
    assert sum(r["retries"] for r in rows) >= 1 and rows[1]["step_ns"] > report.step_rows(clean)[1]["step_ns"]
    assert losses(got) == losses(clean)
    assert [r.digest for r in got] == [r.digest for r in clean]
    assert_equals_reference(got, ref)


@pytest.mark.local
def test_crash_is_survived_by_shrink_and_checkpoint(reference):
    """Six collectives a step (4 SyncBN, 1 bucket, the loss): rank 3 dies entering op 20, in
    step 3; the survivors find it (heartbeat, 30 s), shrink to 7, restore step 2's checkpoint
    and finish: every step's loss is the fault-free one."""
    cfg, ref = reference
    topo = hccl_sim.topology("atlas800t-a2", servers=1)
    got = run(cfg, topo, faults=FaultPlan().rank_crash(3, at_op=20))
    assert got[3] is None
    (event,) = report.events(got)
    assert event["lost_ranks"] == [3] and event["step"] == 3 and event["resumed_step"] == 2
    assert event["ranks"] == 7 and event["error"] == "E_TIMEOUT" and event["detected_ns"] >= 30e9
    rows = report.step_rows(got)
    assert [(r["step"], r["ranks"]) for r in rows] == [(0, 8), (1, 8), (2, 8), (2, 7), (3, 7)]
    assert_equals_reference(got, ref)


@pytest.mark.ray
def test_training_on_ray_equals_local_retries_a_flap_and_survives_a_crash(ray_cluster, reference):
    """On one set of 8 Ray actors: fault-free training equals the full batch; an HCCS link flap in
    step 1 is retried (L0 op retry) with the loss curve and parameters of the fault-free run; a
    crash is shrunk away; flap and crash runs step for step as on the local engine."""
    cfg, ref = reference
    topo = hccl_sim.topology("atlas800t-a2", servers=1)
    plan = FaultPlan().rank_crash(5, at_op=14)
    env = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1", "HCCL_OP_RETRY_ENABLE": "L0:1",
           "HCCL_OP_RETRY_PARAMS": "MaxCnt:3,HoldTime:1,IntervalTime:1"}
    with hccl_sim.Cluster(topo, engine="ray") as cluster:
        clean = cluster.run(train_rank, args=(cfg,))
        flap = FaultPlan().link_flap(0, 1, at=report.step_rows(clean)[1]["start_ns"] / 1e9, duration=1e-3)
        flapped = cluster.run(train_rank, args=(cfg,), faults=flap, env=env)
        crashed = cluster.run(train_rank, args=(cfg,), faults=plan)
    local, local_flap = run(cfg, topo, faults=plan), run(cfg, topo, faults=flap, env=env)
    assert_equals_reference(clean, ref)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]   # noqa: E731
    rows, clean_rows = report.step_rows(flapped), report.step_rows(clean)
    assert [r["retries"] for r in rows] == [0, 1, 0, 0] and rows[1]["step_ns"] > clean_rows[1]["step_ns"]
    assert losses(flapped) == losses(clean) and [r.digest for r in flapped] == [r.digest for r in clean]
    assert strip(rows) == strip(report.step_rows(local_flap))
    assert crashed[5] is None and report.events(crashed)[0]["lost_ranks"] == [5]
    assert_equals_reference(crashed, ref)
    assert [r.digest for r in crashed if r] == [r.digest for r in local if r]
    assert strip(report.step_rows(crashed)) == strip(report.step_rows(local))


# ---- the command ---------------------------------------------------------------------------------------

@pytest.mark.local
def test_train_command_prints_and_writes(tmp_path, capsys):
    js, png, tr = tmp_path / "t.json", tmp_path / "t.png", tmp_path / "trace.json"
    assert main(["train", "--steps", "3", "--hidden", "64", "--batch", "64", "--json", str(js), "--plot", str(png),
                 "--trace", str(tr)]) == 0
    out = capsys.readouterr().out
    assert "# hccl-sim train: MLP 64-64-64-10" in out and "overlap" in out and "bit-identical on every rank" in out
    doc = json.loads(js.read_text())
    assert len(doc["steps"]) == 3 and {"loss", "compute_ns", "comm_ns", "exposed_ns", "step_ns"} <= set(doc["steps"][0])
    assert png.read_bytes()[:4] == b"\x89PNG"
    names = {e.get("name") for e in json.loads(tr.read_text())["traceEvents"]}
    assert {"fc1.forward", "bucket0", "bn1.stats", "sgd"} <= names


@pytest.mark.unit
@pytest.mark.parametrize("argv,message", [
    (["--engine", "timing"], "train runs on local, ray or mpi"),
    (["--batch", "4"], "smaller than the 8 ranks"),
    (["--steps", "0"], "steps must be an integer >= 1"),
    (["--bucket-mb", "-1"], "--bucket-mb -1"),
    (["--trace-step", "1"], "--trace-step needs --trace"),
    (["--lr", "nan"], "lr must be a finite number"),
])
def test_train_command_refuses_bad_arguments(argv, message, capsys):
    assert main(["train"] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.local
def test_train_command_under_a_crash_plan(tmp_path, capsys):
    plan = tmp_path / "crash.yaml"
    FaultPlan().rank_crash(2, at_op=9).save(str(plan))
    assert main(["train", "--steps", "3", "--hidden", "32", "--batch", "64", "--checkpoint-every", "1",
                 "--faults", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "# recovered: rank 2 lost in step 1 (E_TIMEOUT" in out and "shrunk to 7 ranks" in out
    assert "restored the checkpoint of step 1" in out and "bit-identical on every rank" in out
