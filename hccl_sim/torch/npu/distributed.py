"""torch_npu's distributed surface on emulated NPUs: backend "hccl", its Options and hccl_config,
and `torch_npu.distributed`'s own calls (docs/references.md §7.5, §7.7).

- Backend "hccl" is registered for the "npu" device: `dist.init_process_group("hccl")` (and
  new_group) make hccl_sim's ProcessGroup, serving npu tensors (a CPU tensor on it is torch's
  "No backend type associated with device type cpu", as on torch_npu, whose group has only an npu
  backend).
- `torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()`: `hccl_config` (a dict; a group's
  own HcclCommConfig), `_timeout`, `op_timeout`, `is_high_priority_stream`,
  `global_ranks_in_group`, `group_id`. What hccl_config says the group's communicator runs with:
  hccl_buffer_size (MB: HCCL_BUFFSIZE), hccl_algo (HCCL_ALGO), hccl_exec_timeout
  (HCCL_EXEC_TIMEOUT), hccl_retry_enable / hccl_retry_params (HCCL_OP_RETRY_*), group_name (the
  name `get_hccl_comm_name` gives). A value of the wrong type is torch_npu's "Value type of <key>
  should be int." (or string); a key hccl-sim does not model (the QoS keys, hccl_op_expansion_mode,
  hccl_world_rank_id, hccl_job_id, hccl_buffer_name) is refused as not emulated.
- `torch_npu.distributed`: is_hccl_available, reduce_scatter_tensor_uneven,
  all_gather_into_tensor_uneven (torch_npu's Python, calling the backend's methods of those names),
  `_make_hccl_premul_sum`; torch.distributed.batch_isend_irecv is torch_npu's, as torch_npu
  patches it: a list on npu tensors is one HcclBatchSendRecv on the backend.
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupMember, _get_default_group, _rank_not_in_group, \
    _warn_not_in_group, get_group_rank

from ..checks import TorchNpuCheck

BACKEND = "hccl"

# hccl_config key -> (the HCCL variable it sets, its value's type in torch_npu's Options)
_CONFIG_ENV = {"hccl_buffer_size": ("HCCL_BUFFSIZE", int), "hccl_algo": ("HCCL_ALGO", str),
               "hccl_exec_timeout": ("HCCL_EXEC_TIMEOUT", int), "hccl_retry_enable": ("HCCL_OP_RETRY_ENABLE", str),
               "hccl_retry_params": ("HCCL_OP_RETRY_PARAMS", str)}
_NOT_MODELLED = ("qos_traffic_class", "qos_service_level", "hccl_sdma_qos", "hccl_op_expansion_mode",
                 "hccl_world_rank_id", "hccl_job_id", "hccl_buffer_name")


class Options:
    """torch_npu's ProcessGroupHCCL.Options (see the module's docstring)."""

    def __init__(self, is_high_priority_stream: bool = False):
        self.hccl_config = {}
        self.is_high_priority_stream = is_high_priority_stream
        self.op_timeout = None
        self.global_ranks_in_group = []
        self.group_id = ""
        self._timeout = None

    def env(self) -> tuple:
        """(HCCL_* variables the group's communicator runs with, the communicator's name or None)."""
        config = self.hccl_config
        if not isinstance(config, dict):
            raise TorchNpuCheck(f"hccl_config must be a dict, got {type(config).__name__}", "TYPE")
        env, name = {}, None
        for key, value in config.items():
            if key == "group_name":
                if not isinstance(value, str):
                    raise TorchNpuCheck("Value type of group_name should be string.", "TYPE")
                name = value
            elif key in _CONFIG_ENV:
                var, kind = _CONFIG_ENV[key]
                if not isinstance(value, kind) or isinstance(value, bool):
                    raise TorchNpuCheck(f"Value type of {key} should be {'int' if kind is int else 'string'}.", "TYPE")
                env[var] = str(value)
            elif key in _NOT_MODELLED:
                raise TorchNpuCheck(f"hccl_config[{key!r}] is not emulated by hccl-sim (it sets what hccl-sim does "
                                    "not model)", "NOT_SUPPORT")
            else:
                raise TorchNpuCheck(f"hccl_config: unknown key {key!r}", "PARAM")
        return env, name


class ProcessGroupHCCL:
    """The name torch_npu's scripts reach for its group class's Options
    (`torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()`); the groups themselves are
    hccl_sim's ProcessGroup."""
    Options = Options


def install(world, top_module, make_module) -> None:
    """Register backend "hccl" for npu and fill torch_npu's distributed modules."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, lambda opts, pg_options: world.create(opts, pg_options, BACKEND),
                                      extended_api=True, devices=["npu"])
    c = make_module("torch_npu._C", "torch_npu._C as hccl-sim emulates it.")
    c10d = make_module("torch_npu._C._distributed_c10d", "torch_npu's c10d bindings as hccl-sim emulates them.")
    c10d.ProcessGroupHCCL = ProcessGroupHCCL
    c._distributed_c10d = c10d
    top_module._C = c
    d = top_module.distributed
    d.is_hccl_available = lambda: True
    d.reduce_scatter_tensor_uneven = reduce_scatter_tensor_uneven
    d.all_gather_into_tensor_uneven = all_gather_into_tensor_uneven
    d._make_hccl_premul_sum = dist._make_nccl_premul_sum
    import sys
    sys.modules.update({"torch_npu._C": c, "torch_npu._C._distributed_c10d": c10d})
    dist.batch_isend_irecv = batch_isend_irecv
    dist.distributed_c10d.batch_isend_irecv = batch_isend_irecv


def _backend(group):
    group = _get_default_group() if group is None or group is GroupMember.WORLD else group
    return group._get_backend(torch.device("npu"))


def _uneven(name, output, input, split_sizes, group, async_op, *opts):   # noqa: A002
    """What torch_npu's Python does around its backend's uneven op `name`: nothing off the group,
    npu tensors only (a warning and None otherwise), the Work or its wait."""
    if _rank_not_in_group(group):
        _warn_not_in_group(name)
        return None
    if output.device.type != "npu" or input.device.type != "npu":
        warnings.warn("Support for Tensors is limited to those of type npu")
        return None
    work = getattr(_backend(group), name)(output, input, [] if split_sizes is None else split_sizes, *opts)
    if async_op:
        return work
    work.wait()
    return None


def reduce_scatter_tensor_uneven(output, input, input_split_sizes=None, op=dist.ReduceOp.SUM,   # noqa: A002
                                 group=None, async_op=False):
    """torch_npu.distributed.reduce_scatter_tensor_uneven."""
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = op
    return _uneven("reduce_scatter_tensor_uneven", output, input, input_split_sizes, group, async_op, opts)


def all_gather_into_tensor_uneven(output, input, output_split_sizes=None, group=None, async_op=False):   # noqa: A002
    """torch_npu.distributed.all_gather_into_tensor_uneven."""
    return _uneven("all_gather_into_tensor_uneven", output, input, output_split_sizes, group, async_op)


_torch_batch_isend_irecv = dist.batch_isend_irecv


def batch_isend_irecv(p2p_op_list):
    """torch_npu's batch_isend_irecv: a list on npu tensors is one HcclBatchSendRecv on the group's
    backend (peers as the group's ranks); any other list is torch's."""
    if not p2p_op_list or p2p_op_list[0].tensor.device.type != "npu":
        return _torch_batch_isend_irecv(p2p_op_list)
    dist.distributed_c10d._check_p2p_op_list(p2p_op_list)
    group = p2p_op_list[0].group
    names, tensors, peers = [], [], []
    for op in p2p_op_list:
        if op.tensor.device.type != "npu":
            raise TorchNpuCheck(f"No backend type associated with device type {op.tensor.device.type}", "PARAM")
        names.append(op.op.__name__)
        tensors.append(op.tensor)
        peers.append(op.peer if group is None else get_group_rank(group, op.peer))
    return [_backend(group).batch_isend_irecv(names, tensors, peers)]
