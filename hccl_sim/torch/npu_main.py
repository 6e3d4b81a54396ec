"""`python -m hccl_sim.torch.npu_main SCRIPT [ARGS...]`: one rank of a torch_npu program, run
unchanged on emulated NPUs (hccl_sim.torch.npu).

What torchrun, mpirun or a Ray launch starts as each rank's process: it installs the emulated
NPUs (so `import torch_npu`, `torch.npu`, "npu" tensors and backend "hccl" are hccl-sim's), then
runs SCRIPT as `__main__` with ARGS as its sys.argv, as `python SCRIPT ARGS` would. A refusal (a
real torch_npu installed) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import os
import runpy
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print("usage: python -m hccl_sim.torch.npu_main SCRIPT.py [ARGS...]", file=sys.stderr)
        return 2
    os.environ["HCCL_SIM_NPU"] = "1"         # for the processes the script starts itself
    from topologies.errors import HcclError
    try:
        import hccl_sim.torch  # noqa: F401 - registers the backends, hands over the World
        from hccl_sim.torch import npu
        npu.install()
    except HcclError as exc:
        print(f"hccl-sim: error: {exc}", file=sys.stderr)
        return 2
    script = argv[0]
    if not os.path.isfile(script):
        print(f"hccl-sim: error: {script}: no such script", file=sys.stderr)
        return 2
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
