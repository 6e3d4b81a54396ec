"""The torch.distributed backend "hccl_sim" (hccl_sim.torch) on Ray ranks: its collectives against
torch's reference results, sync and async Works, new_group, DistributedDataParallel's parameters
equal to single-process training on the whole batch (with the allreduce and fp16 comm hooks),
and every collective's simulated time reported; plain scripts under torchrun and under mpiexec
(the MPI engine, and hccl_sim.run(engine="mpi")); ranks as threads of one process refused."""
import numpy as np
import pytest

import hccl_sim

import topologies
import torch    # a declared [test] dependency (hccl-sim[torch])

pytestmark = pytest.mark.torch

P = 4


def _collectives(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    out = {}
    t = torch.arange(6, dtype=torch.float32) * (r + 1)
    dist.all_reduce(t)
    out["allreduce"] = t.tolist()
    m = torch.tensor([float(r), float(-r)])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    out["max"] = m.tolist()
    a = torch.full((3,), float(r + 1))
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    out["avg"] = a.tolist()
    work = dist.all_reduce(torch.ones(4, dtype=torch.int64), async_op=True)
    work.wait()
    out["async"] = work.get_future().value()[0].tolist()
    g = [torch.zeros(2) for _ in range(p)]
    dist.all_gather(g, torch.full((2,), float(r)))
    out["allgather"] = [x.tolist() for x in g]
    big = torch.zeros(2 * p)
    dist.all_gather_into_tensor(big, torch.full((2,), float(r)))
    out["allgather_tensor"] = big.tolist()
    b = torch.arange(4.0) if r == 1 else torch.zeros(4)
    dist.broadcast(b, src=1)
    out["broadcast"] = b.tolist()
    rs = torch.zeros(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * p) + r)
    out["reduce_scatter"] = rs.tolist()
    a2a = torch.zeros(p)
    dist.all_to_all_single(a2a, torch.arange(float(p)) + 10 * r)
    out["alltoall"] = a2a.tolist()
    send, recv = _splits(r, p)
    xv = torch.arange(float(sum(send) * 2)).reshape(-1, 2) + 100 * r
    yv = torch.zeros(sum(recv), 2)
    dist.all_to_all_single(yv, xv, output_split_sizes=recv, input_split_sizes=send)    # HCCL's AlltoAllV
    out["alltoallv"] = yv.tolist()
    outs = [torch.zeros(recv[q]) for q in range(p)]
    dist.all_to_all(outs, [torch.full((send[q],), float(r)) for q in range(p)])
    out["alltoall_list"] = [t.tolist() for t in outs]
    dist.barrier()
    sub = dist.new_group([0, 2])
    s = torch.ones(1)
    if r in (0, 2):
        dist.all_reduce(s, group=sub)
        out["sub_time"] = ht.records(sub)[-1].time
    out["sub"] = s.tolist()
    recs = ht.records()
    out["ops"] = [rec.name for rec in recs]
    out["times"] = [rec.time for rec in recs]
    ht.destroy_process_group()
    return out


def test_collectives_match_torch_semantics(torch_cluster):
    p = P
    res = torch_cluster.run(_collectives)
    for r, out in enumerate(res):
        assert out["allreduce"] == (np.arange(6) * sum(range(1, p + 1))).tolist()
        assert out["max"] == [p - 1.0, 0.0] and out["avg"] == [sum(range(1, p + 1)) / p] * 3 and out["async"] == [p] * 4
        assert out["allgather"] == [[float(q)] * 2 for q in range(p)]
        assert out["allgather_tensor"] == [float(q) for q in range(p) for _ in range(2)]
        assert out["broadcast"] == [0.0, 1.0, 2.0, 3.0]
        assert out["reduce_scatter"] == [sum(2 * r + k + q for q in range(p)) for k in range(2)]
        assert out["alltoall"] == [r + 10.0 * q for q in range(p)]
        want = []
        for q in range(p):
            send_q, _ = _splits(q, p)
            rows = (np.arange(sum(send_q) * 2.0).reshape(-1, 2) + 100 * q)
            want += rows[sum(send_q[:r]):sum(send_q[:r + 1])].tolist()
        assert out["alltoallv"] == want
        assert out["alltoall_list"] == [[float(q)] * _splits(r, p)[1][q] for q in range(p)]
        assert out["sub"] == ([2.0] if r in (0, 2) else [1.0])
        assert out["ops"][:2] == ["all_reduce", "all_reduce"] and all(t > 0 for t in out["times"])
    twin = hccl_sim.run(_same_ops, topology=topologies.hardware("atlas800t-a2", devices_per_server=[p]))
    assert [out["times"] for out in res] == twin      # each collective's simulated time is the Communicator's


def _uneven_lists(comm):
    """all_gather and reduce_scatter over lists of tensors of different sizes: HCCL's AllGatherV
    and ReduceScatterV, as torch_npu runs them; scatter: HCCL's Scatter."""
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    sizes = [(q % 3) + 1 for q in range(p)]
    outs = [torch.zeros(n) for n in sizes]
    dist.all_gather(outs, torch.full((sizes[r],), float(r)))
    gathered = ([t.tolist() for t in outs], ht.records()[-1].algo)
    y = torch.zeros(sizes[r])
    dist.reduce_scatter(y, [torch.arange(float(n)) + 10 * q + r for q, n in enumerate(sizes)])
    scattered = y.tolist()
    s = torch.zeros(3)
    dist.scatter(s, [torch.full((3,), float(q)) for q in range(p)] if r == 1 else None, src=1)
    scattered_from_1 = s.tolist()
    ops = [rec.name for rec in ht.records()]
    ht.destroy_process_group()
    return gathered, scattered + scattered_from_1, ops


def test_uneven_lists_run_the_v_ops_and_scatter_runs_hccls(torch_cluster):
    res = torch_cluster.run(_uneven_lists)
    sizes = [(q % 3) + 1 for q in range(P)]
    for r, ((gathered, algo), scattered, ops) in enumerate(res):
        assert gathered == [[float(q)] * n for q, n in enumerate(sizes)] and algo == "level0:fullmesh"
        assert scattered == (np.arange(float(sizes[r])) * P + 10 * r * P + sum(range(P))).tolist() + [float(r)] * 3
        assert ops[-3:] == ["all_gather_v", "reduce_scatter_v", "scatter"]


def _splits(r, p):
    """(rows rank r sends each rank, rows it receives from each): uneven, some zero."""
    return [(r + q) % 3 for q in range(p)], [(q + r) % 3 for q in range(p)]


def _same_ops(comm):
    """The ops _collectives makes, through the hccl_sim API: their simulated times."""
    p, f32 = comm.size, np.float32
    times = []
    for call in (lambda: comm.all_reduce(np.zeros(6, f32)), lambda: comm.all_reduce(np.zeros(2, f32), op="max"),
                 lambda: comm.all_reduce(np.zeros(3, f32)), lambda: comm.all_reduce(np.zeros(4, np.int64)),
                 lambda: comm.all_gather(np.zeros((1, 2), f32)), lambda: comm.all_gather(np.zeros((1, 2), f32)),
                 lambda: comm.broadcast(np.zeros(4, f32), root=1), lambda: comm.reduce_scatter(np.zeros(2 * p, f32)),
                 lambda: comm.all_to_all(np.zeros((p, 1), f32)),
                 lambda: comm.all_to_all_v(np.zeros((sum(_splits(comm.rank, p)[0]), 2), f32), *_splits(comm.rank, p)),
                 lambda: comm.all_to_all_v(np.zeros(sum(_splits(comm.rank, p)[0]), f32), *_splits(comm.rank, p)),
                 comm.barrier):
        call()
        times.append(comm.last_op.time)
    return times


def _ddp(comm, steps, hook, bucket_cap_mb):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    model = _model()
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    if hook == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    _train_shard(ddp, comm, steps)
    params = [q.detach().numpy().copy() for q in model.parameters()]
    recs = ht.records()
    ht.destroy_process_group()
    return params, len(recs), sum(rec.time for rec in recs)


def _train_shard(ddp, comm, steps):
    """SGD on this rank's equal share of each step's 12 samples (DDP averages the gradients)."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    x, y = _data(steps)
    n = x.shape[1] // comm.size
    for s in range(steps):
        mine = slice(comm.rank * n, (comm.rank + 1) * n)
        loss = ((ddp(x[s, mine]) - y[s, mine]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _model():
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _data(steps):
    import torch
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, 12, 8, generator=g), torch.randn(steps, 12, 4, generator=g)


def _full_batch(model, steps):
    """`model` trained in one process on the whole batch of every step (the reference DDP must equal)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = _data(steps)
    for s in range(steps):
        loss = ((model(x[s]) - y[s]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _reference(steps):
    return [q.detach().numpy() for q in _full_batch(_model(), steps).parameters()]


@pytest.mark.parametrize("hook,atol", [(None, 1e-5), ("allreduce", 1e-5), ("fp16", 2e-3)])
def test_ddp_parameters_equal_full_batch_training(torch_cluster, hook, atol):
    steps = 4
    res = torch_cluster.run(_ddp, args=(steps, hook, 0.001))
    want = _reference(steps)
    for params, n_ops, sim in res:
        assert n_ops > steps and sim > 0               # DDP's broadcast + several buckets per step
        for got, ref in zip(params, want):
            assert np.allclose(got, ref, atol=atol)
    for params, _, _ in res[1:]:                       # bit-identical across ranks
        assert all(np.array_equal(a, b) for a, b in zip(params, res[0][0]))


def _bn_model():
    import torch.nn as nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def _ddp_syncbn(comm, steps):
    from torch.nn.parallel import DistributedDataParallel as DDP
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    model = ht.convert_sync_batchnorm(_bn_model())
    assert isinstance(model[1], ht.SyncBatchNorm)
    ddp = DDP(model)
    _train_shard(ddp, comm, steps)
    out = [q.detach().numpy().copy() for q in model.parameters()]
    out += [model[1].running_mean.numpy().copy(), model[1].running_var.numpy().copy()]
    ht.destroy_process_group()
    return out


def test_syncbn_under_ddp_equals_full_batch_batchnorm(torch_cluster):
    """A CPU model's BatchNorm1d converted to hccl_sim.torch.SyncBatchNorm, under DDP on 4 ranks of
    3 samples each: parameters and running statistics as one process with BatchNorm1d on all 12."""
    steps = 3
    model = _full_batch(_bn_model(), steps)
    want = [q.detach().numpy() for q in model.parameters()] + [model[1].running_mean.numpy(),
                                                              model[1].running_var.numpy()]
    res = torch_cluster.run(_ddp_syncbn, args=(steps,))
    for got in res:
        for a, b in zip(got, want):
            assert np.allclose(a, b, atol=1e-5)


# ---- a plain script under torchrun ------------------------------------------------------------------

def _torchrun(nproc, script_args, env):
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    import socket
    with socket.socket() as probe:            # a free port for torchrun's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", str(port),
           os.path.join(here, "torch_scripts", "ddp_launched.py")] + script_args
    full = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1", "HCCL_EXEC_TIMEOUT": "60", **env}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=full)


def test_torchrun_script_on_the_backend():
    """torchrun --nproc-per-node 3: init_process_group(backend="hccl_sim") finds its peers through
    torch's store; one host: the shared-memory plane (nothing left in /dev/shm); collectives,
    new_group and DDP as in one process on the whole batch."""
    import json
    import os
    from hcomm.memory import segments as shm
    steps = 3
    before = set(os.listdir("/dev/shm"))
    done = _torchrun(3, [str(steps)], {"HCCL_SIM_TOPOLOGY": "atlas800t-a2"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [n for n in set(os.listdir("/dev/shm")) - before if n.startswith(shm.PREFIX)]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
    ranks = json.loads(line[len("RESULT "):])
    want = [q.flatten() for q in _reference(steps)]
    for out in ranks:
        assert out["allreduce"] == [0.0, 6.0, 12.0, 18.0]
        assert out["plane"] == "shm" and out["big"] == [6.0]      # one host: the shared-memory plane
        assert out["sub"] == ([2.0] if out["rank"] in (0, 2) else [1.0])
        for got, ref in zip(out["params"], want):
            assert np.allclose(got, ref, atol=1e-5)
        assert out["params"] == ranks[0]["params"] and out["ops"] > steps and out["sim"] > 0


def test_torchrun_job_across_two_nodes_reads_a_nodes_peers_in_place():
    """Two torchrun agents (--nnodes 2, two processes each; the nodes share this machine but not
    memory as far as the job knows): the per-rank executor, a node's ranks sending each other
    slices by place; results and DDP as in one process."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from hcomm.memory import segments as shm
    here = os.path.dirname(os.path.abspath(__file__))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "HCCL_EXEC_TIMEOUT": "60", "HCCL_SIM_TOPOLOGY": "atlas800t-a2"}
    steps = 3
    before = set(os.listdir("/dev/shm"))
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(k),
                                "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                                os.path.join(here, "torch_scripts", "ddp_launched.py"), str(steps)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for k in (0, 1)]
    outs = [a.communicate(timeout=240) for a in agents]
    assert all(a.returncode == 0 for a in agents), [o[1][-2000:] for o in outs]
    assert not [n for n in set(os.listdir("/dev/shm")) - before if n.startswith(shm.PREFIX)]
    line = next(l for l in outs[0][0].splitlines() if l.startswith("RESULT "))
    ranks = json.loads(line[len("RESULT "):])
    want = [q.flatten() for q in _reference(steps)]
    for out in ranks:
        assert out["allreduce"] == [0.0, 10.0, 20.0, 30.0] and out["big"] == [10.0]
        assert out["plane"] == "socket" and out["by_place"] > 0    # across nodes; in place inside each
        for got, ref in zip(out["params"], want):
            assert np.allclose(got, ref, atol=1e-5)


def test_torchrun_topology_that_does_not_fit_the_launch():
    done = _torchrun(2, ["1"], {"HCCL_SIM_TOPOLOGY": "atlas800t-a2:servers=2"})
    assert done.returncode != 0
    assert "has 16 ranks but the launcher started 2 (WORLD_SIZE)" in done.stderr


# ---- under mpiexec, and ranks that are threads ---------------------------------------------------------

def test_mpiexec_script_and_mpi_engine_runs():
    """mpiexec -n 3, no torchrun variables: init_process_group(backend="hccl_sim") is MPI's rank
    and size on the MPI engine (DDP, new_group, local-engine times), hccl_sim.torch works inside
    hccl_sim.run(engine="mpi"), and two ranks per process are refused (tests/torch_scripts/torch_mpi.py)."""
    import os
    import shutil
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               HCCL_EXEC_TIMEOUT="60")
    before = set(os.listdir("/dev/shm"))
    done = subprocess.run([shutil.which("mpiexec") or "mpiexec", "-n", "3", sys.executable,
                           os.path.join(here, "torch_scripts", "torch_mpi.py")],
                          capture_output=True, text=True, timeout=240, env=env, cwd=root)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    import re       # the processes' lines may interleave
    assert sorted(int(r) for r in re.findall(r"OK (\d+)", done.stdout)) == [0, 1, 2], (done.stdout, done.stderr[-2000:])
    from conftest import mapped_outside     # a segment another developer's mpiexec job maps is not ours
    assert not [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("mpich") and not mapped_outside(n)]


def _torch_on_a_thread(comm):
    import hccl_sim.torch as ht
    ht.init_process_group(comm)


def test_local_engine_ranks_are_refused_with_the_reason():
    """Threads of one process cannot each have torch's (per-process) default group."""
    with pytest.raises(hccl_sim.HcclError, match="one default process group per process") as info:
        hccl_sim.run(_torch_on_a_thread, topology=hccl_sim.topology("fullmesh", ranks=2))
    assert info.value.code == "E_NOT_SUPPORT" and "engine='ray'" in str(info.value)


def _failing_collectives(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    seen = []
    try:
        for call in (lambda: dist.all_reduce(torch.ones(4, 2).t()),                   # not contiguous
                     lambda: dist.all_reduce(torch.ones(4, 2).t(), async_op=True).wait(),
                     lambda: dist.all_reduce(torch.ones(4, 2).t(), async_op=True).get_future().wait()):
            try:
                call()
                seen.append(None)
            except Exception as exc:   # noqa: BLE001 - what torch hands back is the test's subject
                seen.append(str(exc))
        t = torch.ones(3)
        dist.all_reduce(t)                 # the group goes on after a failed op
        return seen, t.tolist()
    finally:
        ht.destroy_process_group()


def test_a_failed_collective_raises_from_wait_and_future():
    """A lone rank (one per process) on the local engine: the HcclError of a failed collective
    reaches a synchronous call, work.wait() and get_future().wait()."""
    seen, after = hccl_sim.run(_failing_collectives, topology=hccl_sim.topology("fullmesh", ranks=1))[0]
    assert len(seen) == 3 and all(s is not None and "contiguous" in s for s in seen), seen
    assert after == [1.0, 1.0, 1.0]
