"""SyncBatchNorm for CPU modules: batch statistics over the whole data-parallel batch.

torch's nn.SyncBatchNorm refuses CPU tensors (its constructor checks under DDP, its forward, and
the fused kernels it calls have no CPU implementation), so this is the same computation in
plain torch ops, with torch.distributed's own collectives (so on the hccl_sim backend it runs
through hccl-sim): forward all-reduces the per-channel sum, square-sum and count (in float64,
as one AllReduce) and normalises with the global mean and biased variance, updating the running
statistics with the unbiased one; backward all-reduces the per-channel sums of the gradient and
of gradient x normalised input and returns torch's SyncBatchNorm input gradient. The weight and
bias gradients are this rank's sums, which DDP then averages, as with torch's SyncBatchNorm.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor, group):
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        shape = [1, c] + [1] * (x.dim() - 2)
        x64 = x.detach().to(torch.float64)
        stats = torch.cat([x64.sum(dims), (x64 * x64).sum(dims),
                           torch.tensor([x.numel() / c], dtype=torch.float64)])
        dist.all_reduce(stats, group=group)
        count = float(stats[2 * c])
        mean = stats[:c] / count
        var = (stats[c:2 * c] / count - mean * mean).clamp_min(0)
        invstd = (var + eps).rsqrt()
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
                unbiased = var * (count / max(count - 1, 1))
                running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        xhat = (x - mean.to(x.dtype).view(shape)) * invstd.to(x.dtype).view(shape)
        ctx.save_for_backward(xhat, weight, invstd.to(x.dtype))
        ctx.count, ctx.group, ctx.dims, ctx.shape = count, group, dims, shape
        y = xhat
        if weight is not None:
            y = y * weight.view(shape) + bias.view(shape)
        return y

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape, c = ctx.dims, ctx.shape, xhat.shape[1]
        local_dy = dy.sum(dims)
        local_dy_xhat = (dy * xhat).sum(dims)
        sums = torch.cat([local_dy, local_dy_xhat]).to(torch.float64)
        dist.all_reduce(sums, group=ctx.group)
        sum_dy, sum_dy_xhat = sums[:c].to(dy.dtype).view(shape), sums[c:].to(dy.dtype).view(shape)
        scale = invstd.view(shape) / ctx.count
        if weight is not None:
            scale = scale * weight.view(shape)
        dx = scale * (ctx.count * dy - sum_dy - xhat * sum_dy_xhat)
        dw = local_dy_xhat if weight is not None else None
        db = local_dy if weight is not None else None
        return dx, dw, db, None, None, None, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """nn.SyncBatchNorm's interface, on CPU tensors (any input of shape (N, C, ...))."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input):          # noqa: A002 - torch's name
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):                   # noqa: A002 - torch's name
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:           # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        need_sync = self.training and dist.is_available() and dist.is_initialized() and \
            dist.get_world_size(self.process_group) > 1
        if not need_sync:
            use_batch = self.training or not self.track_running_stats
            return nn.functional.batch_norm(
                input, self.running_mean if not self.training or self.track_running_stats else None,
                self.running_var if not self.training or self.track_running_stats else None,
                self.weight, self.bias, use_batch, factor, self.eps)
        group = self.process_group or dist.group.WORLD
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias,
                                            self.running_mean if self.track_running_stats else None,
                                            self.running_var if self.track_running_stats else None,
                                            self.eps, factor, group)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """Every BatchNorm*D of `module` replaced by a SyncBatchNorm with its parameters and
        running statistics (torch's nn.SyncBatchNorm.convert_sync_batchnorm)."""
        out = module
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


convert_sync_batchnorm = SyncBatchNorm.convert_sync_batchnorm
