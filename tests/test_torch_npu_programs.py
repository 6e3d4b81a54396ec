"""torch_npu programs run unchanged on emulated NPUs by `hccl-sim torchrun` (issue 36): torch_npu's
distributed surface (backend "hccl", ProcessGroupHCCL.Options' hccl_config, the uneven ops,
batch_isend_irecv as one BatchSendRecv, torch_npu's checks) and the DDP example, whose losses
equal one process training on the whole batch."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]


def _torchrun(*args):
    return subprocess.run([sys.executable, "-m", "hccl_sim", "torchrun", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)


def test_torch_npus_distributed_surface_in_an_unchanged_script(tmp_path):
    p = 3
    done = _torchrun("--nproc-per-node", str(p), "tests/torch_scripts/npu_surface.py", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    splits = [1, 2, 3]
    for r in range(p):
        out = json.loads((tmp_path / f"out.{r}.json").read_text())
        assert (out["backend"], out["device"], out["count"], out["comm_name"]) == ("hccl", str(r), p, "world_of_npus")
        assert out["avg"] == [(6 * p + sum(range(p))) // p] * 4
        assert out["bool"] == [True, False, True]
        assert out["cpu_tensor"] == "No backend type associated with device type cpu"
        assert out["rs_uneven"] == [[float(sum(range(1, p + 1)))] * 2] * splits[r]
        assert out["ag_uneven"] == [float(q) for q in range(p) for _ in range(splits[q])]
        assert out["batch"] == [[10.0 + r] * 2, [float((r - 1) % p)] * 2, 1]
        assert out["bad_config"] == "Value type of hccl_buffer_size should be int."
        assert out["not_emulated"].endswith("torch_npu.npu_fusion_attention is not emulated by hccl-sim")
        assert out["records"] == ["all_reduce", "broadcast", "reduce_scatter_v", "all_gather_v", "batch_send_recv"]


@pytest.mark.parametrize("example", ["ddp", "fsdp2", "tp"])    # moe, pp: measured in RESULTS.md (CI time)
def test_the_torch_npu_examples_train_as_one_process(tmp_path, example):
    done = _torchrun("--nproc-per-node", "2", f"examples/ascend/{example}_train.py", "--steps", "2",
                     "--json", str(tmp_path / "out.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["ranks"] == 2
    assert got["losses"] == pytest.approx(got["one_process"], rel=1e-5)


def test_bad_launches_are_one_line_errors(tmp_path):
    for args, said in [(("--nproc-per-node", "2"), "no SCRIPT.py given"),
                       (("--servers", "0", "x.py"), "--servers '0' is not a positive integer"),
                       (("--nproc-per-node", "2", str(tmp_path / "missing.py")), "no such script")]:
        done = _torchrun(*args)
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_torch_npu_script_on_ray_actors(tmp_path, ray_cluster):
    """hccl_sim.torch.launch(script, engine="ray", npu=True): the same unchanged script in Ray actors
    (fresh ones: emulated NPUs change an actor's torch for good)."""
    import hccl_sim.torch as ht
    out = tmp_path / "ray.json"
    assert ht.launch(str(ROOT / "examples/ascend/ddp_train.py"), 2, args=["--steps", "2", "--json", str(out)],
                     engine="ray", npu=True) == [None, None]
    got = json.loads(out.read_text())
    assert got["losses"] == pytest.approx(got["one_process"], rel=1e-5)
