"""The build-it-yourself unit of Part III (training): its checks pass on the reference (the
book's own code plugged in, ``llmbook/workbench/units/build3_training.py``) and on a plain
textbook version of every function written here, each planted bug fails its exercise with a
message that names the problem while the exercises that do not call the broken function
still pass, every exercise has a check, and the generated stub grades as not attempted."""

from __future__ import annotations

import importlib
import inspect
import math
import re
import types

import pytest
import torch

STEM = "build3_training"
reference = importlib.import_module(f"llmbook.workbench.units.{STEM}")
checks = importlib.import_module("llmbook.workbench.checks.build3")

pytestmark = pytest.mark.usefixtures("one_thread")

CHECKS = {name: f for name, f in vars(checks).items()
          if name.startswith("exercise_") and inspect.isfunction(f)}
NAMES = ("cross_entropy", "cross_entropy_backward", "linear_backward", "clip_grad_norm",
         "cosine_schedule", "adamw_step")


def _number(name: str) -> int:
    return int(re.match(r"exercise_(\d+)_", name).group(1))


def _uses(name: str) -> set[str]:
    return set(re.findall(r"solutions\.(\w+)", inspect.getsource(CHECKS[name])))


def _with(**replaced) -> types.SimpleNamespace:
    """The reference's functions, with some replaced."""
    found = {n: getattr(reference, n) for n in NAMES}
    found.update(replaced)
    return types.SimpleNamespace(**found)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_reference_passes(name: str) -> None:
    CHECKS[name](reference)


def test_the_end_to_end_exercise_uses_every_function() -> None:
    assert _uses(max(CHECKS, key=_number)) == set(NAMES)


# ---------------------------------------------------------------- a reader's plain version

def plain_cross_entropy(logits, targets, ignore_index=-100):
    keep = targets != ignore_index
    if not keep.any():
        raise ValueError("every target is ignore_index")
    m = logits.amax(dim=-1, keepdim=True)
    lse = m.squeeze(-1) + (logits - m).exp().sum(dim=-1).log()
    picked = logits.gather(-1, torch.where(keep, targets, 0).unsqueeze(-1)).squeeze(-1)
    return ((lse - picked) * keep).sum() / keep.sum()


def plain_cross_entropy_backward(logits, targets, ignore_index=-100):
    keep = targets != ignore_index
    if not keep.any():
        raise ValueError("every target is ignore_index")
    p = (logits - logits.amax(dim=-1, keepdim=True)).exp()
    p = p / p.sum(dim=-1, keepdim=True)
    p = p - torch.nn.functional.one_hot(torch.where(keep, targets, 0), logits.shape[-1])
    return p * keep.unsqueeze(-1) / keep.sum()


def plain_linear_backward(x, W, grad_out):
    X, G = x.reshape(-1, x.shape[-1]), grad_out.reshape(-1, W.shape[0])
    return grad_out @ W, G.T @ X, G.sum(dim=0)


def plain_clip_grad_norm(grads, max_norm, eps=1e-6):
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    scale = min(1.0, max_norm / (norm + eps))
    return [g * scale for g in grads], norm


def plain_cosine_schedule(step, max_lr, min_lr, warmup_steps, total_steps):
    if warmup_steps > total_steps or min_lr > max_lr:
        raise ValueError("bad schedule")
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step >= total_steps:
        return float(min_lr)
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))


def plain_adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr, betas=(0.9, 0.999), eps=1e-8,
                     weight_decay=1e-2):
    b1, b2 = betas
    param = param * (1 - lr * weight_decay)
    m = b1 * exp_avg + (1 - b1) * grad
    v = b2 * exp_avg_sq + (1 - b2) * grad * grad
    m_hat, v_hat = m / (1 - b1**step), v / (1 - b2**step)
    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v


PLAIN = types.SimpleNamespace(**{n: globals()[f"plain_{n}"] for n in NAMES})


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_plain_textbook_version_passes_too(name: str) -> None:
    """The tolerances leave room for a reader's own rounding: written from the docstrings'
    formulas, in the obvious order of operations, not PyTorch's."""
    CHECKS[name](PLAIN)


# ---------------------------------------------------------------- planted bugs

def ce_without_the_max_shift(logits, targets, ignore_index=-100):
    keep = targets != ignore_index
    lse = logits.exp().sum(dim=-1).log()  # exp(10^4) overflows
    picked = logits.gather(-1, torch.where(keep, targets, 0).unsqueeze(-1)).squeeze(-1)
    return ((lse - picked) * keep).sum() / keep.sum()


def ce_mean_over_every_position(logits, targets, ignore_index=-100):
    keep = targets != ignore_index
    return plain_cross_entropy(logits, targets, ignore_index) * keep.sum() / targets.numel()


def ce_backward_over_every_position(logits, targets, ignore_index=-100):
    keep = targets != ignore_index
    return plain_cross_entropy_backward(logits, targets, ignore_index) * keep.sum() / targets.numel()


def ce_backward_forgets_the_mean(logits, targets, ignore_index=-100):
    keep = targets != ignore_index
    return plain_cross_entropy_backward(logits, targets, ignore_index) * keep.sum()


def linear_backward_bias_mean(x, W, grad_out):
    gx, gW, gb = plain_linear_backward(x, W, grad_out)
    return gx, gW, gb / grad_out.reshape(-1, W.shape[0]).shape[0]


def linear_backward_transposed_weight(x, W, grad_out):
    gx, gW, gb = plain_linear_backward(x, W, grad_out)
    return gx, gW.T, gb


def clip_without_eps(grads, max_norm, eps=1e-6):
    return plain_clip_grad_norm(grads, max_norm, 0.0)


def clip_each_tensor_alone(grads, max_norm, eps=1e-6):
    out = [g * min(1.0, max_norm / (float(g.norm()) + eps)) for g in grads]
    return out, math.sqrt(sum(float((g * g).sum()) for g in grads))


def schedule_warmup_from_one_step(step, max_lr, min_lr, warmup_steps, total_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps  # never 0: starts one step late
    return plain_cosine_schedule(step, max_lr, min_lr, warmup_steps, total_steps)


def schedule_decays_to_zero(step, max_lr, min_lr, warmup_steps, total_steps):
    return plain_cosine_schedule(step, max_lr, 0.0, warmup_steps, total_steps)


def adam_with_l2(param, grad, exp_avg, exp_avg_sq, step, lr, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2):
    return plain_adamw_step(param, grad + weight_decay * param, exp_avg, exp_avg_sq, step, lr,
                            betas, eps, 0.0)


def _decay_and_moments(param, grad, exp_avg, exp_avg_sq, lr, betas, weight_decay):
    b1, b2 = betas
    m = b1 * exp_avg + (1 - b1) * grad
    return param * (1 - lr * weight_decay), m, b2 * exp_avg_sq + (1 - b2) * grad * grad


def adamw_without_bias_correction(param, grad, exp_avg, exp_avg_sq, step, lr, betas=(0.9, 0.999),
                                  eps=1e-8, weight_decay=1e-2):
    param, m, v = _decay_and_moments(param, grad, exp_avg, exp_avg_sq, lr, betas, weight_decay)
    return param - lr * m / (v.sqrt() + eps), m, v


def adamw_eps_before_the_correction(param, grad, exp_avg, exp_avg_sq, step, lr, betas=(0.9, 0.999),
                                    eps=1e-8, weight_decay=1e-2):
    param, m, v = _decay_and_moments(param, grad, exp_avg, exp_avg_sq, lr, betas, weight_decay)
    b1, b2 = betas
    return param - lr * (m / (1 - b1**step)) / ((v.sqrt() + eps) / math.sqrt(1 - b2**step)), m, v


#: (the function replaced, the bug, the exercises that must fail, what the message must say)
BUGS = [
    ("cross_entropy", ce_without_the_max_shift, {1}, r"subtract each row's maximum"),
    ("cross_entropy", ce_mean_over_every_position, {1, 7}, r"the mean is over the targets that are not"),
    ("cross_entropy_backward", ce_backward_over_every_position, {2, 7},
     r"N = \d+ the number of targets that are not ignore_index"),
    ("cross_entropy_backward", ce_backward_forgets_the_mean, {2, 7}, r"torch\.autograd on F\.cross_entropy"),
    ("linear_backward", linear_backward_bias_mean, {3, 7}, r"sums over the batch positions"),
    ("linear_backward", linear_backward_transposed_weight, {3, 7}, r"grad_W of shape \(4, 7\)"),
    ("clip_grad_norm", clip_without_eps, {4, 7}, r"eps = 1e-06"),
    ("clip_grad_norm", clip_each_tensor_alone, {4, 7}, r"scaled as torch\.nn\.utils\.clip_grad_norm_"),
    ("cosine_schedule", schedule_warmup_from_one_step, {5, 7}, r"expected lr\(0\) = 0\.0"),
    ("cosine_schedule", schedule_decays_to_zero, {5, 7}, r"the book's cosine_schedule"),
    ("adamw_step", adam_with_l2, {6, 7}, r"lambda theta is not added to the gradient"),
    ("adamw_step", adamw_without_bias_correction, {6, 7}, r"bias corrections divide m by 1 - beta1"),
    ("adamw_step", adamw_eps_before_the_correction, {6, 7}, r"eps is added to sqrt\(v_hat\)"),
]


@pytest.mark.parametrize("name, bug, failing, message", BUGS, ids=[b[1].__name__ for b in BUGS])
def test_a_planted_bug_fails_its_exercise_and_only_where_it_is_used(name, bug, failing, message):
    answers = _with(**{name: bug})
    for check_name, check in sorted(CHECKS.items(), key=lambda kv: _number(kv[0])):
        n = _number(check_name)
        if n in failing:
            with pytest.raises(AssertionError, match=message if n == min(failing) else None):
                check(answers)
        else:
            assert n == 7 or name not in _uses(check_name)
            check(answers)


def test_the_end_to_end_check_names_where_the_loop_went_wrong():
    """A bug that the end-to-end loop feels shows up there with the step and the quantity."""
    with pytest.raises(AssertionError, match=r"expected the loss .* at step 0"):
        checks.exercise_7_end_to_end_training(_with(cross_entropy=ce_mean_over_every_position))
    with pytest.raises(AssertionError, match=r"largest difference .* in "):
        checks.exercise_7_end_to_end_training(_with(adamw_step=adam_with_l2))


# ---------------------------------------------------------------- the stub and the grader

def test_the_stub_grades_as_not_attempted_and_the_reference_as_passed(tmp_path):
    from llmbook.workbench.grader import grade
    from llmbook.workbench.runner import NOT_ATTEMPTED, PASSED
    from llmbook.workbench.stubs import make_stub

    source = inspect.getsource(reference)
    stub = tmp_path / f"{STEM}.py"
    stub.write_text(make_stub(source, STEM), encoding="utf-8")
    assert "from llmbook" not in stub.read_text(encoding="utf-8")
    rows = grade("build-III", stub)
    assert [r.exercise for r in rows] == sorted(checks.EXERCISES)
    assert all(r.status == NOT_ATTEMPTED for r in rows), [(r.exercise, r.status, r.detail) for r in rows]
    mine = tmp_path / "mine.py"
    mine.write_text(source, encoding="utf-8")
    rows = grade("build-III", mine)
    assert all(r.status == PASSED for r in rows), [(r.exercise, r.status, r.detail) for r in rows]
