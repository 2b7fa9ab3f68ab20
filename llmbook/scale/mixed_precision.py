"""Mixed-precision training: 16-bit compute, float32 master weights, dynamic loss scaling.

Used in notebooks/22_distributed_training. The tools were introduced in chapter 10 and live
in :mod:`llmbook.training.memory` (Part III, which a Part VI module may import); this
module re-exports them under their chapter-22 names:

* :func:`half_ulp`: the smallest update a 16-bit weight can absorb;
* :class:`MasterWeightOptimizer`: float32 master copies of 16-bit weights;
* :class:`DynamicLossScaler` and :func:`scaler_trajectory`: dynamic loss scaling, and a
  driver that compares it with ``torch.amp.GradScaler``;
* :func:`mixed_precision_bytes_symbolic`: 16 bytes per parameter with Adam.
"""

from __future__ import annotations

from llmbook.training.memory import (
    DynamicLossScaler,
    MasterWeightOptimizer,
    half_ulp,
    mixed_precision_bytes_symbolic,
    scaler_trajectory,
)

__all__ = [
    "DynamicLossScaler",
    "MasterWeightOptimizer",
    "half_ulp",
    "mixed_precision_bytes_symbolic",
    "scaler_trajectory",
]
