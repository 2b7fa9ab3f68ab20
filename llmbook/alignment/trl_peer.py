"""TRL's trainers as peers: calling a trainer's own loss code on tensors, without a trainer.

TRL's ``DPOTrainer._compute_loss`` and ``GRPOTrainer._compute_loss`` read a few things from
``self`` (the accelerator, the metrics store, the model in eval mode). Building a real
trainer needs a model, a dataset and accelerate's state; the book's tests and the
workbench's checks compare the book's losses with TRL's by making a bare instance of the
trainer class (:func:`bare_trainer`, which skips ``__init__``) and giving it these
stand-ins. Written against trl 1.16 (pinned in ``pyproject.toml``), whose attribute names
they follow.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

__all__ = ["Accelerator", "EvalModel", "bare_trainer"]


class Accelerator:
    """A single-process ``accelerate.Accelerator``: gathering and reducing are the identity."""

    device = torch.device("cpu")
    num_processes = 1
    process_index = 0
    sync_gradients = True

    def gather(self, x: Any) -> Any:
        return x

    gather_for_metrics = gather

    def reduce(self, x: Any, reduction: str = "sum") -> Any:
        return x


class EvalModel:
    """The trainer's model in eval mode (so no gradient-accumulation scaling): calling it
    returns the fixed ``output`` given at construction."""

    training = False
    is_gradient_checkpointing = False

    def __init__(self, output: Any = None) -> None:
        self.output = output

    def __call__(self, **kwargs: Any) -> Any:
        return self.output


def bare_trainer(cls: type, **attributes: Any) -> Any:
    """An instance of the trainer class ``cls`` without running its ``__init__``: an
    :class:`Accelerator`, an empty metrics store, and ``attributes`` (which win)."""
    obj = object.__new__(cls)
    obj.__dict__.update({"accelerator": Accelerator(),
                         "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)},
                         **attributes})
    return obj
