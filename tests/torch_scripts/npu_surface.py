"""A torch_npu script for tests/test_torch_npu_programs.py, run unchanged by `hccl-sim torchrun`:
torch_npu's distributed surface on emulated NPUs; each rank writes what it saw to OUT.<rank>.json."""
import json
import os
import sys

import torch
import torch_npu
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.npu.set_device(local_rank)
options = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
options.hccl_config = {"hccl_buffer_size": 100, "group_name": "world_of_npus"}
dist.init_process_group(backend="hccl", pg_options=options)
r, p = dist.get_rank(), dist.get_world_size()
out = {"backend": dist.get_backend(), "device": str(torch.npu.current_device()), "count": torch.npu.device_count()}
pg = dist.group.WORLD._get_backend(torch.device("npu"))
out["comm_name"] = pg.get_hccl_comm_name(r)
t = torch.full((4,), 6 + r, dtype=torch.int32).npu()
dist.all_reduce(t, op=dist.ReduceOp.AVG)
out["avg"] = t.cpu().tolist()
b = torch.tensor([r == 0, False, True], device="npu")
dist.broadcast(b, src=0)
out["bool"] = b.cpu().tolist()
try:
    dist.all_reduce(torch.ones(2))
except RuntimeError as exc:
    out["cpu_tensor"] = str(exc).split("\n")[0]
splits = [k + 1 for k in range(p)]
rs = torch.zeros(splits[r], 2, device="npu")
torch_npu.distributed.reduce_scatter_tensor_uneven(rs, torch.ones(sum(splits), 2, device="npu") * (r + 1), splits)
out["rs_uneven"] = rs.cpu().tolist()
ag = torch.zeros(sum(splits), device="npu")
torch_npu.distributed.all_gather_into_tensor_uneven(ag, torch.full((splits[r],), float(r), device="npu"), splits)
out["ag_uneven"] = ag.cpu().tolist()
own, prev = torch.zeros(2, device="npu"), torch.zeros(2, device="npu")
works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), 10. + r, device="npu"), r),
                                dist.P2POp(dist.irecv, own, r),
                                dist.P2POp(dist.isend, torch.full((2,), float(r), device="npu"), (r + 1) % p),
                                dist.P2POp(dist.irecv, prev, (r - 1) % p)])
for w in works:
    w.wait()
out["batch"] = [own.cpu().tolist(), prev.cpu().tolist(), len(works)]
sub_opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
sub_opts.hccl_config = {"hccl_buffer_size": "big"}
try:
    dist.new_group(ranks=list(range(p)), pg_options=sub_opts)
except RuntimeError as exc:
    out["bad_config"] = str(exc).split("\n")[0]
try:
    torch_npu.npu_fusion_attention
except Exception as exc:             # noqa: BLE001 - the text is the answer
    out["not_emulated"] = str(exc)
out["records"] = [rec.name for rec in __import__("hccl_sim.torch").torch.records()]
dist.destroy_process_group()
with open(f"{sys.argv[1]}.{r}.json", "w") as f:
    json.dump(out, f)
