"""Emulated NPU devices (hccl_sim.torch.npu): every way a torch_npu script names the device,
training on npu equal to CPU bit for bit, host_tensor's shared bytes, HBM accounting and
torch_npu's out-of-memory error, names not emulated, and the refusal to shadow a real torch_npu.
install() changes torch for the whole process (a device, its module, a dispatcher fallback), so it
runs once, in a module fixture."""
import copy
import gc
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.torch

import torch  # noqa: E402 - a declared test dependency: never skipped

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def npu():
    import hccl_sim.torch.npu as hn
    hn.install()
    hn.install()                     # idempotent
    return hn


def test_every_way_a_script_names_the_device(npu):
    import torch_npu
    assert torch_npu.npu is torch.npu
    assert torch.npu.is_available() and torch.npu.device_count() == 8       # one 910B server
    torch.npu.set_device("npu:2")
    assert torch.npu.current_device() == 2
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    named = {
        "npu()": (a.npu(), 2), "npu(i)": (a.npu(1), 1), "to('npu')": (a.to("npu"), 2),
        "to('npu:0')": (a.to("npu:0"), 0), "to(f'npu:{i}')": (a.to(f"npu:{5}"), 5),
        "device=npu": (torch.arange(6, dtype=torch.float32, device="npu").reshape(2, 3), 2),
        "torch.device": (a.to(torch.device("npu", 3)), 3),
        "tensor(device=)": (torch.tensor([[0., 1, 2], [3, 4, 5]], device=torch.device("npu:4")), 4),
    }
    for how, (t, index) in named.items():
        assert t.device == torch.device("npu", index), how
        assert npu.is_npu(t) and t.is_npu and not npu.is_npu(t.cpu()), how
        assert torch.equal(t.cpu(), a), how
    torch.npu.set_device(torch.device("npu", 0))
    assert torch.zeros(1, device="npu").device.index == 0
    with torch.npu.device(6):
        assert torch.ones(1, device="npu").device.index == 6
    assert torch.npu.current_device() == 0
    with pytest.raises(Exception, match="npu:8: invalid device"):
        torch.zeros(1, device="npu:8")


def test_ops_views_and_devices(npu):
    a = torch.randn(4, 5)
    x = a.to("npu")
    assert torch.equal((x @ x.t()).cpu(), a @ a.t()) and (x.sum() * 2).item() == (a.sum() * 2).item()
    assert "device='npu:0'" in repr(x) and x.cpu().numpy().tolist() == a.numpy().tolist()
    assert x.is_contiguous() and not x.t().is_contiguous() and x.t().contiguous().is_contiguous()
    assert torch.equal(x.t().contiguous().cpu(), a.t().contiguous())
    row = x[1]                       # a view written in place changes its base (a collective's output)
    row.mul_(0).add_(7)
    assert x[1].cpu().tolist() == [7.0] * 5 and x._base is None and row._base is x
    idx = x[torch.tensor([0, 3])]    # CPU indices are taken, as on a device
    assert torch.equal(idx.cpu(), a[[0, 3]])
    out = torch.empty(0, device="npu")
    torch.cumsum(x, 0, out=out)      # an out= whose kernel resizes it
    assert out.shape == (4, 5) and torch.equal(out.cpu(), torch.cumsum(x.cpu(), 0))
    small = torch.zeros(2, device="npu")
    with pytest.warns(UserWarning, match="was resized"):     # one with bytes, which moves to new ones
        torch.add(x[0], 1, out=small)
    assert torch.equal(small.cpu(), x[0].cpu() + 1)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + a
    with pytest.raises(RuntimeError, match="npu:0 and npu:1"):
        x + x.to("npu:1")
    assert torch.equal((x + torch.tensor(1.0)).cpu(), x.cpu() + 1)       # a CPU scalar is taken
    assert copy.deepcopy(x).device == x.device and torch.equal(copy.deepcopy(x).cpu(), x.cpu())
    with torch.autocast("npu", dtype=torch.bfloat16):        # passes through: no autocast kernels
        assert torch.nn.Linear(5, 2).npu()(x).dtype == torch.float32


def _train(model, device, steps=3, foreach=None):
    torch.manual_seed(1)
    model = model.to(device)
    # foreach=None: torch's default, its foreach form on npu (as on any accelerator) and the loop on CPU
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, foreach=foreach)
    data, target = torch.randn(16, 6), torch.randint(0, 3, (16,))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data.to(device)), target.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()], model


def test_training_equals_cpu_bit_for_bit(npu):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                                torch.nn.Linear(16, 3))
    for device, foreach in (("npu", None), ("npu:3", True)):       # npu:3: autograd on a card other than 0
        cpu_losses, cpu_params, _ = _train(copy.deepcopy(model), "cpu", foreach=foreach)
        losses, params, trained = _train(copy.deepcopy(model), device, foreach=foreach)
        assert losses == cpu_losses, device
        assert all(torch.equal(p, q) for p, q in zip(params, cpu_params)), device
        w = trained[0].weight
        assert isinstance(w, torch.nn.Parameter) and w.device == torch.device(device if ":" in device else "npu:0")
        assert w.grad.device == w.device
    torch.manual_seed(5)
    on_card = torch.randn(7, device="npu")
    torch.manual_seed(5)
    assert torch.equal(on_card.cpu(), torch.randn(7))
    torch.manual_seed(6)            # a card draws from its own generator, seeded as the CPU's is
    dropped = torch.nn.functional.dropout(torch.ones(64, device="npu"), 0.5)
    torch.manual_seed(6)
    assert torch.equal(dropped.cpu(), torch.nn.functional.dropout(torch.ones(64), 0.5))
    torch.npu.manual_seed(9)                        # the card's generator alone
    first = torch.rand(3, device="npu")
    torch.npu.manual_seed(9)
    assert torch.equal(torch.rand(3, device="npu").cpu(), first.cpu())


def test_host_tensor_shares_bytes(npu):
    x = torch.zeros(3, 4, device="npu:1")
    view = x[:, 1:3]
    h = npu.host_tensor(view)
    assert h.device.type == "cpu" and h.shape == view.shape and h.stride() == view.stride()
    assert h.dtype == view.dtype and h.storage_offset() == view.storage_offset() == 1
    assert h.data_ptr() == view.data_ptr()
    h.fill_(5)                       # a write through the host tensor is the npu tensor's
    assert x.cpu().tolist() == [[0.0, 5.0, 5.0, 0.0]] * 3
    view.add_(1)                     # and the other way round
    assert h.tolist() == [[6.0, 6.0]] * 3
    kept = npu.host_tensor(torch.arange(4, device="npu"))       # it keeps the npu bytes alive
    gc.collect()
    torch.ones(1000, device="npu")
    assert kept.tolist() == [0, 1, 2, 3]
    with pytest.raises(Exception, match="expected a tensor on an npu device"):
        npu.host_tensor(torch.zeros(2))


def test_memory_statistics_and_oom(npu):
    torch.npu.set_device(0)
    gc.collect()
    before, (free0, total) = torch.npu.memory_allocated(), torch.npu.mem_get_info()
    assert total == 64 * 2**30
    torch.npu.reset_peak_memory_stats()
    t = torch.empty(1000, 1000, device="npu")        # 4e6 bytes + 32 of padding, in 512-byte blocks
    assert torch.npu.memory_allocated() - before == 4000256
    assert free0 - torch.npu.mem_get_info()[0] == 4000256
    del t
    gc.collect()
    assert torch.npu.memory_allocated() == before and torch.npu.max_memory_allocated() == before + 4000256
    with pytest.raises(torch.OutOfMemoryError) as err:
        torch.empty(2**36, device="npu")              # 256 GiB, refused before the host allocates
    assert str(err.value).startswith("NPU out of memory. Tried to allocate 256.00 GiB (NPU 0; 64.00 GiB total "
                                     "capacity; ")
    assert torch.npu.OutOfMemoryError is torch.OutOfMemoryError
    assert torch.npu.memory_allocated() == before


def test_streams_and_events(npu):
    s = torch.npu.Stream()
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s != torch.npu.default_stream()
        start.record()
        s.npu_stream.enqueue("work", 2_500_000)          # 2.5 ms of simulated work on the stream
        end.record()
    assert torch.npu.current_stream() == torch.npu.default_stream()
    assert start.elapsed_time(end) == pytest.approx(2.5)
    assert not end.query() and not s.query()          # the host has not waited for it yet
    torch.npu.current_stream().wait_event(end)
    torch.npu.synchronize()
    assert end.query() and s.query()
    with pytest.raises(Exception, match="enable_timing=True"):
        torch.npu.Event().elapsed_time(end)


def test_names_not_emulated(npu):
    import torch_npu
    from topologies.errors import HcclError
    with pytest.raises(HcclError, match="torch_npu.npu_fusion_attention is not emulated by hccl-sim") as err:
        torch_npu.npu_fusion_attention
    assert err.value.code == "E_NOT_SUPPORT"
    with pytest.raises(HcclError, match="torch_npu.distributed.reinit_process_group is not emulated"):
        torch_npu.distributed.reinit_process_group
    assert not hasattr(torch.npu, "set_dump")        # torch's own probes keep working
    torch_npu.distributed.marker = 1                  # the distributed part fills it by assignment
    assert torch_npu.distributed.marker == 1
    import torch_npu.distributed as tnd
    assert tnd is torch_npu.distributed


def test_refuses_to_shadow_a_real_torch_npu(tmp_path):
    fake = tmp_path / "torch_npu"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('the real torch_npu was imported')\n")
    code = textwrap.dedent("""
        import hccl_sim.torch.npu as hn
        from topologies.errors import HcclError
        try:
            hn.install()
        except HcclError as exc:
            print("refused:", exc)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "refused:" in run.stdout and "a real torch_npu is installed" in run.stdout
    assert "hccl-sim will not shadow it" in run.stdout and str(fake) in run.stdout
