"""The torch parallelism examples (examples/torch_*.py) on 4 Ray ranks: each one's losses and
final parameters against the same model trained in one process on the whole batch."""
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name):
    """The example as a module the rank actors unpickle by value (examples/ is not on their path)."""
    import ray.cloudpickle
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    return module


def test_fsdp2_transformer_equals_one_process_on_the_whole_batch(torch_cluster):
    ex = _example("torch_fsdp2")
    steps, batch = 3, 16
    res = torch_cluster.run(ex.on_ray_rank, args=(steps, batch))
    losses, want = ex.reference(steps, batch)
    for log, params in res:
        assert [round(loss, 4) for loss, *_ in log] == [round(loss, 4) for loss in losses]
        assert max(abs(a - b) for a, b in zip((loss for loss, *_ in log), losses)) < 1e-5
        assert all(float((params[k] - want[k]).abs().max()) < 1e-5 for k in want)
        ops = {name for _, recs, _ in log for name, *_ in recs}
        assert ops == {"all_gather", "reduce_scatter", "all_reduce"}      # FSDP2's, and the loss's mean
