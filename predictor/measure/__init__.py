"""Ground truth for the memory model: build a ModelSpec's rank-local shard in PyTorch, run
real training steps and record the peak (exactly on the CPU under fake tensors, or with the
CUDA allocator's statistics on a GPU)."""

from predictor.measure.runner import MeasuredPeak, in_flight, measure_peak
from predictor.measure.tracker import LiveStorage, StorageTracker

__all__ = ["LiveStorage", "MeasuredPeak", "StorageTracker", "in_flight", "measure_peak"]
