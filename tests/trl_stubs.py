"""Stand-ins for what trl 1.16's trainers read from ``self``, so that the peer tests can call
a trainer's loss method on tensors without building a trainer (no model, no data, no
accelerate state)."""

from __future__ import annotations

import torch


class Accelerator:
    """A single-process accelerate.Accelerator: gathering and reducing are the identity."""

    device = torch.device("cpu")
    num_processes = 1
    process_index = 0
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x
