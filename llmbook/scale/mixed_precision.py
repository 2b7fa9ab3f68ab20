"""Mixed-precision training: 16-bit compute, float32 master weights, dynamic loss scaling.

Introduced in notebooks/22_distributed_training. Micikevicius et al. (2018, "Mixed Precision
Training") run the forward and backward passes in 16 bits and keep three safeguards:

* **float32 master weights.** An update smaller than half the spacing (ulp) of the 16-bit
  numbers around a weight rounds away: bfloat16 has 8 significant bits, so at w = 1 any
  |update| < 2^-8 is lost. The optimizer therefore updates a float32 copy and the 16-bit
  weights are re-cast from it after every step (:class:`MasterWeightOptimizer`).
* **loss scaling.** float16's smallest positive (subnormal) number is 2^-24 ~ 6e-8; smaller
  gradients flush to zero. Multiplying the loss by S multiplies every gradient by S (the
  chain rule is linear), lifting them into range; the float32 copy is divided by S again.
* **dynamic scale.** S too large overflows to inf. :class:`DynamicLossScaler` starts high,
  and on a step whose gradients hold an inf or a NaN skips the update and halves S; after
  ``growth_interval`` good steps in a row it doubles S (the policy of ``torch.amp.GradScaler``).

Memory: 2 bytes of 16-bit weight + 2 of gradient + 4 of master weight + 4 + 4 of Adam's
moments = 16 bytes per parameter (:func:`mixed_precision_bytes_symbolic`), against 16 for
float32 training too (4 + 4 + 4 + 4): mixed precision saves activation memory and time, not
parameter-state memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import sympy as sp
import torch
from torch import Tensor, nn

from llmbook.validation import check_positive_int, check_positive_number

__all__ = [
    "DynamicLossScaler",
    "MasterWeightOptimizer",
    "half_ulp",
    "mixed_precision_bytes_symbolic",
    "scaler_trajectory",
]


def half_ulp(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Half the spacing of ``dtype``'s numbers at |x| (normal range): an update of smaller
    magnitude added to x rounds back to x (round to nearest, ties to even).

    For |x| in [2^e, 2^(e+1)) the spacing is eps * 2^e, with eps = ``finfo(dtype).eps``
    (2^-7 for bfloat16, 2^-10 for float16, 2^-23 for float32).
    """
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    x = torch.as_tensor(x, dtype=torch.float64)
    if (x == 0).any() or not torch.isfinite(x).all():
        raise ValueError("half_ulp needs finite non-zero x (the normal range)")
    exponent = torch.floor(torch.log2(x.abs()))
    return torch.finfo(dtype).eps * torch.exp2(exponent) / 2


def mixed_precision_bytes_symbolic() -> dict[str, sp.Expr]:
    """Bytes per parameter of mixed-precision Adam, from the bits of each copy kept.

    16-bit weight and gradient; float32 master weight and Adam's first and second moments.
    Returns each term and the total (16), and K = 12, the optimizer's share (ZeRO's K).
    """
    bits = {"weight (16-bit)": 16, "gradient (16-bit)": 16, "master weight (fp32)": 32,
            "Adam m (fp32)": 32, "Adam v (fp32)": 32}
    terms = {name: sp.Integer(b) / 8 for name, b in bits.items()}
    terms["total"] = sum(terms.values())
    terms["K (optimizer states)"] = sum(v for k, v in terms.items() if "fp32" in k)
    return terms


class DynamicLossScaler:
    """Dynamic loss scaling (Micikevicius et al., 2018, section 3.2; ``torch.amp.GradScaler``'s rule).

    Per step: ``scaled = scaler.scale(loss)``; ``scaled.backward()``; then
    ``scaler.step(optimizer, params)`` divides the gradients by S, and if any is inf/NaN
    skips ``optimizer.step()``; finally :meth:`update` halves S after an overflow (times
    ``backoff_factor``), or multiplies it by ``growth_factor`` after ``growth_interval``
    consecutive good steps. ``history`` records (scale used, stepped) per step.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.scale_value = check_positive_number("init_scale", init_scale)
        self.growth_factor = check_positive_number("growth_factor", growth_factor)
        self.backoff_factor = check_positive_number("backoff_factor", backoff_factor)
        if self.growth_factor <= 1 or self.backoff_factor >= 1:
            raise ValueError(f"need growth_factor > 1 and backoff_factor < 1, got "
                             f"{growth_factor} and {backoff_factor}")
        self.growth_interval = check_positive_int("growth_interval", growth_interval)
        self.good_steps = 0
        self.found_inf = False
        self.history: list[tuple[float, bool]] = []

    def scale(self, loss: Tensor) -> Tensor:
        """The loss times S (backward through it gives S times the gradients)."""
        return loss * self.scale_value

    @torch.no_grad()
    def unscale_(self, params: Iterable[Tensor]) -> bool:
        """Divide every ``.grad`` by S in place (in its own dtype); return whether any
        gradient holds an inf or a NaN."""
        found = False
        for p in params:
            if p.grad is None:
                continue
            p.grad.div_(self.scale_value)
            found = found or not bool(torch.isfinite(p.grad).all())
        self.found_inf = found
        return found

    def step(self, optimizer_step: Callable[[], object], params: Iterable[Tensor]) -> bool:
        """Unscale, then call ``optimizer_step()`` unless a gradient overflowed; then
        :meth:`update`. Returns whether the step was taken."""
        found = self.unscale_(params)
        if not found:
            optimizer_step()
        self.history.append((self.scale_value, not found))
        self.update()
        return not found

    def update(self) -> None:
        """Back off after an overflow; grow after ``growth_interval`` good steps in a row."""
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.good_steps = 0
        self.found_inf = False


class MasterWeightOptimizer:
    """Keep float32 master copies of a 16-bit model's parameters and step those.

    ``optimizer_factory(master_params)`` builds the optimizer on the masters (e.g.
    ``lambda ps: AdamW(ps, lr=1e-3)``). :meth:`step` copies the 16-bit gradients into the
    masters' float32 ``.grad`` (dividing by the loss scale, if a scaler is given), skips the
    step on overflow, updates the masters and casts them back into the model.
    """

    def __init__(self, params: Iterable[nn.Parameter],
                 optimizer_factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 scaler: DynamicLossScaler | None = None,
                 master_dtype: torch.dtype = torch.float32) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("no parameter requires a gradient")
        self.masters = [nn.Parameter(p.detach().to(master_dtype).clone()) for p in self.params]
        self.optimizer = optimizer_factory(self.masters)
        self.scaler = scaler

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> bool:
        """One update; returns False if it was skipped (overflow)."""
        for p, m in zip(self.params, self.masters, strict=True):
            m.grad = None if p.grad is None else p.grad.to(m.dtype)
        if self.scaler is None:
            self.optimizer.step()
            stepped = True
        else:
            stepped = self.scaler.step(self.optimizer.step, self.masters)
        for p, m in zip(self.params, self.masters, strict=True):
            p.copy_(m)  # cast back to the model's 16-bit dtype
        return stepped


def scaler_trajectory(scaler: object, gradients: list[float], dtype: torch.dtype = torch.float16
                      ) -> list[tuple[float, bool]]:
    """Drive a loss scaler (the book's :class:`DynamicLossScaler` or ``torch.amp.GradScaler``)
    through one step per entry of ``gradients`` and record (scale used, step taken).

    A one-parameter model w (float32) has loss g_t * w; its scaled gradient g_t S is rounded
    to ``dtype`` as a 16-bit backward would (so S g_t above 65504 overflows to inf in
    float16), and SGD with lr = 1 is the optimizer. The step was taken iff w moved.
    """
    w = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([w], lr=1.0)
    out = []
    for g in gradients:
        optimizer.zero_grad()
        loss = torch.tensor(float(g)) * w.sum()
        is_book = isinstance(scaler, DynamicLossScaler)
        scale = scaler.scale_value if is_book else float(scaler.get_scale())
        scaler.scale(loss).backward()
        with torch.no_grad():  # what a 16-bit backward would have produced
            w.grad.copy_(w.grad.to(dtype).float())
        before = w.detach().clone()
        if is_book:
            scaler.step(optimizer.step, [w])
        else:
            scaler.step(optimizer)
            scaler.update()
        out.append((scale, not torch.equal(before, w.detach())))
    return out
