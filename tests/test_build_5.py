"""The build-it-yourself unit of Part V (alignment): its reference passes every check, so does
a plain version of every function written here from the docstrings alone (torch only), and
planted bugs fail the check of their exercise alone, with a message that names the problem.

The reference (``llmbook/workbench/units/build5_alignment.py``) is the book's code plugged
in; the checks (``llmbook/workbench/checks/build5.py``) compare with TRL's trainers,
torchrl's GAE, ``F.cross_entropy`` and the book. A planted bug is the reference with one
function replaced by a plausible mistake, in a ``SimpleNamespace``.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from llmbook.workbench import checks as checks_package

STEM = "build5_alignment"
reference = importlib.import_module(f"llmbook.workbench.units.{STEM}")
checks = importlib.import_module("llmbook.workbench.checks.build5")

pytestmark = pytest.mark.usefixtures("one_thread")

CHECKS = sorted((n for n, f in vars(checks).items() if n.startswith("exercise_") and inspect.isfunction(f)),
                key=lambda n: int(n.split("_")[1]))


def _number(name: str) -> int:
    return int(re.match(r"exercise_(\d+)", name).group(1))


@pytest.mark.parametrize("name", CHECKS)
def test_reference_passes(name: str) -> None:
    getattr(checks, name)(reference)


# ---------------------------------------------------------------- a reader's plain version
# Every function written from the reference's docstring alone, with torch only.


def plain_completion_logprobs(logits, input_ids, completion_mask):
    logp = torch.log_softmax(logits[:, :-1], dim=-1)  # position t - 1 predicts token t
    picked = logp.gather(-1, input_ids[:, 1:, None])[..., 0]  # (B, T - 1)
    keep = completion_mask[:, 1:].bool()
    return torch.where(keep, picked, torch.zeros_like(picked)).sum(dim=1)


def plain_dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
    r_w = beta * (policy_chosen_logps - ref_chosen_logps)
    r_l = beta * (policy_rejected_logps - ref_rejected_logps)
    loss = -F.logsigmoid(r_w - r_l).mean()
    return loss, r_w.detach(), r_l.detach()


def plain_gae(rewards, values, gamma, lam, mask):
    on = mask.bool()
    B, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(B, dtype=rewards.dtype)
    next_advantage = torch.zeros(B, dtype=rewards.dtype)
    for t in reversed(range(T)):  # backwards; padding counts as value 0 and advantage 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_advantage
        a = torch.where(on[:, t], a, torch.zeros_like(a))
        advantages[:, t] = a
        next_value = torch.where(on[:, t], values[:, t], torch.zeros_like(a))
        next_advantage = a
    returns = torch.where(on, advantages + values, torch.zeros_like(values))
    return advantages, returns


def plain_ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_eps):
    ratio = torch.exp(logprobs - old_logprobs.detach())
    adv = advantages.detach()
    per_token = torch.maximum(-ratio * adv, -ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    return per_token[mask.bool()].mean()


def plain_dpo_batch_loss(policy, prompts, chosen, rejected, ref_chosen_logps, ref_rejected_logps, beta):
    n, p = prompts.shape
    ids = torch.cat([torch.cat([prompts, chosen], 1), torch.cat([prompts, rejected], 1)], 0)  # (2N, P + R)
    mask = torch.zeros_like(ids)
    mask[:, p:] = 1
    logps = plain_completion_logprobs(policy(ids), ids, mask)
    loss, _, _ = plain_dpo_loss(logps[:n], logps[n:], ref_chosen_logps, ref_rejected_logps, beta)
    return loss


PLAIN = SimpleNamespace(completion_logprobs=plain_completion_logprobs, dpo_loss=plain_dpo_loss,
                        gae=plain_gae, ppo_clip_loss=plain_ppo_clip_loss,
                        dpo_batch_loss=plain_dpo_batch_loss)


@pytest.mark.parametrize("name", CHECKS)
def test_a_plain_version_passes_too(name: str) -> None:
    getattr(checks, name)(PLAIN)


# ---------------------------------------------------------------- planted bugs


def _no_shift(logits, input_ids, completion_mask):
    """Scores the token at t with the logits at t (no shift by one)."""
    logp = torch.log_softmax(logits, -1).gather(-1, input_ids[..., None])[..., 0]
    return (logp * completion_mask).sum(1)


def _times_mask(logits, input_ids, completion_mask):
    """Shifts rightly but multiplies by the mask: -inf * 0 = NaN at a forbidden masked token."""
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, input_ids[:, 1:, None])[..., 0]
    return (logp * completion_mask[:, 1:]).sum(1)


def _log_of_sigmoid(pc, pr, rc, rr, beta):
    """log(sigmoid(u)) instead of logsigmoid(u): inf for a margin of -1000."""
    r_w, r_l = beta * (pc - rc), beta * (pr - rr)
    return -torch.log(torch.sigmoid(r_w - r_l)).mean(), r_w.detach(), r_l.detach()


def _gae_without_mask(rewards, values, gamma, lam, mask):
    """Ignores the mask: padded steps' values and rewards flow back into the episode."""
    from llmbook.alignment.losses import gae

    return gae(rewards, values, gamma, lam)


def _ppo_min(logprobs, old_logprobs, advantages, mask, clip_eps):
    """min instead of max of the two negated terms: the optimistic bound."""
    ratio = torch.exp(logprobs - old_logprobs.detach())
    adv = advantages.detach()
    per_token = torch.minimum(-ratio * adv, -ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    m = mask.to(per_token.dtype)
    return (per_token * m).sum() / m.sum()


def _dpo_batch_loss_sum(policy, prompts, chosen, rejected, ref_chosen_logps, ref_rejected_logps, beta):
    """The sum over pairs instead of the mean."""
    n = prompts.shape[0]
    return n * reference.dpo_batch_loss(policy, prompts, chosen, rejected, ref_chosen_logps,
                                        ref_rejected_logps, beta)


BUGS = [  # (function, its buggy version, the exercise that must fail, words its message must hold)
    ("completion_logprobs", _no_shift, 1, "expected minus F.cross_entropy summed over the completion"),
    ("completion_logprobs", _times_mask, 1, "-inf * 0 is NaN"),
    ("dpo_loss", _log_of_sigmoid, 2, "compute -log sigmoid(u) with F.logsigmoid"),
    ("gae", _gae_without_mask, 3, "expected torchrl's advantages and value targets"),
    ("ppo_clip_loss", _ppo_min, 4, "expected TRL GRPOTrainer's bnpo loss"),
    ("dpo_batch_loss", _dpo_batch_loss_sum, 5, "expected the book's DPO loss"),
]


def _namespace(**replaced) -> SimpleNamespace:
    public = {n: f for n, f in vars(reference).items() if inspect.isfunction(f) and not n.startswith("_")
              and f.__module__ == reference.__name__}
    return SimpleNamespace(**{**public, **replaced})


@pytest.mark.parametrize(("name", "bug", "number", "words"), BUGS,
                         ids=[f"{b[0]}-{b[1].__name__.strip('_')}" for b in BUGS])
def test_planted_bug_fails_its_exercise_alone(name, bug, number, words) -> None:
    answers = _namespace(**{name: bug})
    for check in CHECKS:
        if _number(check) == number:
            with pytest.raises(AssertionError) as err:
                getattr(checks, check)(answers)
            assert words in str(err.value), str(err.value)
        else:
            getattr(checks, check)(answers)


def test_the_planted_bugs_are_bugs() -> None:
    """The buggy versions differ from the reference where the checks look (so that a check that
    passed them would be too weak, not the bug too small)."""
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    ids, mask = torch.randint(0, 7, (2, 5)), torch.ones(2, 5)
    assert not torch.allclose(_no_shift(logits, ids, mask), reference.completion_logprobs(logits, ids, mask))
    ok = torch.tensor([-1.0, -2001.0], dtype=torch.float64)
    assert torch.isinf(_log_of_sigmoid(ok, ok.flip(0), 0 * ok, 0 * ok, 0.5)[0])
    assert F.logsigmoid(torch.tensor(-1000.0)).isfinite()


# ---------------------------------------------------------------- the stub, graded by file


def test_stub_grades_as_not_attempted(tmp_path: Path) -> None:
    from llmbook.workbench.grader import grade
    from llmbook.workbench.stubs import make_stub

    source = Path(reference.__file__).read_text()
    stub = tmp_path / f"{STEM}.py"
    stub.write_text(make_stub(source, STEM))
    rows = list(grade(STEM, stub))
    assert [r.exercise for r in rows] == sorted(checks.EXERCISES)
    assert all(r.status == "not attempted" for r in rows), [(r.exercise, r.status, r.detail) for r in rows]
    assert set(checks_package.checks_for(STEM)) == set(checks.EXERCISES)
