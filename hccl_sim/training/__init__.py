"""Data-parallel training driven through hccl-sim: a numpy MLP with SyncBatchNorm on
the UCI handwritten digits (shipped with it), DDP-style gradient buckets overlapped with backward in simulated time,
elastic recovery after a crash (`hccl-sim train`; hccl_sim.training.trainer)."""
from .trainer import RankResult, StepRecord, TrainConfig, train_rank, train_reference

__all__ = ["TrainConfig", "StepRecord", "RankResult", "train_rank", "train_reference"]
