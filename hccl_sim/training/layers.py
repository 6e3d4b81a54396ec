"""The numpy layers of the trainer's MLP, each with its forward, backward and their cost.

Linear, BatchNorm (synchronised across data-parallel ranks as torch's SyncBatchNorm: the
per-channel sum, square-sum and count of the whole batch in forward, the per-channel sums of the
gradient and of gradient x normalised input in backward, each combined by one AllReduce through
`sync`), ReLU, and a numerically stable softmax cross-entropy (log-sum-exp with the row maximum
subtracted, so large logits neither overflow nor lose the small ones).

Every layer says what its forward and backward cost as (FLOPs, bytes moved) for a batch of n
rows; the trainer charges them on the device roofline (hccl_sim.npu.device). float32 throughout, as a
torch model on an NPU trains (BatchNorm's statistics accumulate in float64).
"""
from __future__ import annotations

import abc

import numpy as np

DTYPE = np.float32
ITEM = np.dtype(DTYPE).itemsize


class Layer(abc.ABC):
    def __init__(self, name: str):
        self.name = name
        self.params, self.grads = {}, {}

    @abc.abstractmethod
    def forward(self, x, sync):
        """This layer's output for input x (training mode); `sync` combines across ranks."""

    @abc.abstractmethod
    def backward(self, dy, sync):
        """The input's gradient from the output's; sets self.grads."""

    @abc.abstractmethod
    def cost(self, n: int) -> tuple:
        """((forward FLOPs, bytes), (backward FLOPs, bytes)) for n rows."""

    def state(self) -> dict:
        """Everything a checkpoint must restore besides the parameters (running statistics)."""
        return {}

    def load_state(self, state: dict) -> None:
        pass


class Linear(Layer):
    """y = x W + b; W initialised as torch's nn.Linear (uniform in +-1/sqrt(fan_in))."""

    def __init__(self, name, fan_in: int, fan_out: int, rng):
        super().__init__(name)
        bound = 1.0 / np.sqrt(fan_in)
        self.params["weight"] = rng.uniform(-bound, bound, size=(fan_in, fan_out)).astype(DTYPE)
        self.params["bias"] = rng.uniform(-bound, bound, size=fan_out).astype(DTYPE)
        self.fan_in, self.fan_out = fan_in, fan_out

    def forward(self, x, sync):
        self._x = x
        return x @ self.params["weight"] + self.params["bias"]

    def backward(self, dy, sync):
        self.grads["weight"] = self._x.T @ dy
        self.grads["bias"] = dy.sum(axis=0)
        return dy @ self.params["weight"].T

    def cost(self, n):
        i, o = self.fan_in, self.fan_out
        forward = (2 * n * i * o, ITEM * (n * i + i * o + o + n * o))
        backward = (4 * n * i * o + n * o, ITEM * (2 * n * o + n * i + 2 * i * o + o + n * i))
        return forward, backward


class BatchNorm(Layer):
    """Batch normalisation over the batch axis; with `sync` of several ranks, over the whole
    data-parallel batch (SyncBatchNorm). Running statistics as torch (momentum 0.1, the running
    variance unbiased); eps 1e-5."""

    EPS, MOMENTUM = 1e-5, 0.1

    def __init__(self, name, channels: int):
        super().__init__(name)
        self.params["weight"] = np.ones(channels, dtype=DTYPE)
        self.params["bias"] = np.zeros(channels, dtype=DTYPE)
        self.running_mean = np.zeros(channels, dtype=DTYPE)
        self.running_var = np.ones(channels, dtype=DTYPE)
        self.channels = channels

    def forward(self, x, sync):
        c = self.channels
        # statistics accumulate in float64, as torch's CPU kernels accumulate float in double:
        # the square-sum form loses a float32's digits to cancellation on near-constant channels
        x64 = x.astype(np.float64)
        stats = np.empty(2 * c + 1, dtype=np.float64)
        stats[:c] = x64.sum(axis=0)
        stats[c:2 * c] = (x64 * x64).sum(axis=0)
        stats[2 * c] = x.shape[0]
        total = sync.all_reduce(stats, f"{self.name}.stats")
        count = float(total[2 * c])
        mean = total[:c] / count
        var = np.maximum(total[c:2 * c] / count - mean * mean, 0)
        invstd = (1.0 / np.sqrt(var + self.EPS)).astype(DTYPE)
        mean = mean.astype(DTYPE)
        self._xhat = (x - mean) * invstd
        self._invstd, self._count = invstd, count
        m = self.MOMENTUM
        unbiased = var * (count / max(count - 1, 1))
        self.running_mean = ((1 - m) * self.running_mean + m * mean).astype(DTYPE)
        self.running_var = ((1 - m) * self.running_var + m * unbiased).astype(DTYPE)
        return self._xhat * self.params["weight"] + self.params["bias"]

    def backward(self, dy, sync):
        c, xhat = self.channels, self._xhat
        local = np.empty(2 * c, dtype=np.float64)
        local[:c] = dy.sum(axis=0, dtype=np.float64)
        local[c:] = (dy * xhat).sum(axis=0, dtype=np.float64)
        # the parameters' gradients are this rank's share: DDP's AllReduce sums them (as torch)
        self.grads["bias"], self.grads["weight"] = local[:c].astype(DTYPE), local[c:].astype(DTYPE)
        total = sync.all_reduce(local, f"{self.name}.grad_stats")
        sum_dy, sum_dy_xhat = total[:c].astype(DTYPE), total[c:].astype(DTYPE)
        scale = self.params["weight"] * self._invstd / self._count
        return scale * (self._count * dy - sum_dy - xhat * sum_dy_xhat)

    def cost(self, n):
        c = self.channels
        return (8 * n * c, ITEM * (3 * n * c + 6 * c)), (10 * n * c, ITEM * (4 * n * c + 6 * c))

    def state(self):
        return {"running_mean": self.running_mean.copy(), "running_var": self.running_var.copy()}

    def load_state(self, state):
        self.running_mean, self.running_var = state["running_mean"].copy(), state["running_var"].copy()


class ReLU(Layer):
    def forward(self, x, sync):
        self._mask = x > 0
        return x * self._mask

    def backward(self, dy, sync):
        return dy * self._mask

    def cost(self, n):
        return (0, 0), (0, 0)           # fused into the neighbouring kernels, as an NPU graph does


def softmax_cross_entropy(logits, labels, scale: float) -> tuple:
    """(sum of the rows' losses, d(scale x loss sum)/d logits, correct predictions): the loss of
    a row is log-sum-exp(z) - z[label], computed with the row maximum subtracted."""
    z = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(z)
    total = exp.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    losses = np.log(total[:, 0]) - z[rows, labels]
    grad = exp / total
    grad[rows, labels] -= 1
    correct = int((logits.argmax(axis=1) == labels).sum())
    return float(losses.astype(np.float64).sum()), (grad * DTYPE(scale)).astype(DTYPE), correct


def loss_cost(n: int, classes: int) -> tuple:
    return (6 * n * classes, ITEM * 3 * n * classes), (2 * n * classes, ITEM * 2 * n * classes)


class MLP:
    """Linear -> BatchNorm -> ReLU, `depth` times, then a Linear to the classes; parameters in
    registration order (torch's module.parameters() order)."""

    def __init__(self, features: int, hidden: int, classes: int, depth: int = 2, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.layers, width = [], features
        for k in range(depth):
            self.layers += [Linear(f"fc{k + 1}", width, hidden, rng), BatchNorm(f"bn{k + 1}", hidden),
                            ReLU(f"relu{k + 1}")]
            width = hidden
        self.layers.append(Linear(f"fc{depth + 1}", width, classes, rng))
        self.classes = classes

    def parameters(self) -> list:
        """[(name, layer, key)] in registration order."""
        return [(f"{layer.name}.{key}", layer, key) for layer in self.layers for key in layer.params]

    def num_parameters(self) -> int:
        return sum(layer.params[key].size for _, layer, key in self.parameters())
