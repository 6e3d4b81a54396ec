"""What the torch_npu example scripts share: their options, the one-process reference beside
each rank 0's losses, and the JSON a test reads. The models and references are the torch
examples' (examples/tiny_lm.py, examples/torch_moe.py)."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def options(doc, batch):
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--json", help="write the losses, the one-process losses and wall times here (rank 0)")
    return ap.parse_args()


def finish(args, world, losses, walls, reference_losses):
    """Rank 0: each step's loss beside one process's on the whole batch; the JSON."""
    for step, (a, b) in enumerate(zip(losses, reference_losses)):
        print(f"step {step}: loss {a:.6f} on {world} npus, {b:.6f} in one process, {walls[step]:.3f} s wall")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": world, "losses": losses, "one_process": reference_losses, "wall_s": walls}, f)
