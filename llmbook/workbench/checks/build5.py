"""Checks of the build-it-yourself unit of Part V (alignment), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the reader's functions as ``solutions.name(...)``
and compares them, in float64 and on shapes where no two sizes are equal, with the code
that aligns models: TRL 1.16's ``DPOTrainer._compute_loss`` (the ``"sigmoid"`` loss) and
``GRPOTrainer._compute_loss`` (``"bnpo"`` with beta = 0, PPO's clipped surrogate), each
built without running its ``__init__`` and fed the reader's inputs through a stub model,
as ``tests/test_alignment_losses.py`` does; torchrl's ``generalized_advantage_estimate``;
``torch.nn.functional.cross_entropy``; and the book's own implementations
(:mod:`llmbook.alignment.logprobs`, :mod:`llmbook.alignment.losses`,
:mod:`llmbook.alignment.dpo`). The last exercise trains a tiny ``TransformerLM`` for three
DPO steps with the reader's loss and with the book's ``dpo_step``. TRL and torchrl are
imported inside the checks that use them (several seconds the first time).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from llmbook.alignment.trl_peer import EvalModel, bare_trainer

#: number: (stars, title), in the order of building.
EXERCISES = {
    1: (1, "Log-probabilities of completions, shifted by one, with a loss mask"),
    2: (1, "The DPO loss, against TRL's DPOTrainer"),
    3: (2, "Generalised advantage estimation, against torchrl"),
    4: (2, "PPO's clipped surrogate loss, against TRL"),
    5: (2, "End to end: three DPO steps on a tiny transformer"),
}

f64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _largest(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def _num(t: torch.Tensor) -> float:
    return float(t.detach())


def _ragged_mask(lengths: list[int], width: int, start: int = 0) -> torch.Tensor:
    """(len(lengths), width) 0/1 mask with ones on positions start .. start + lengths[b] - 1."""
    t = torch.arange(width)[None, :]
    first = torch.full((len(lengths), 1), start)
    return ((t >= first) & (t < first + torch.tensor(lengths)[:, None])).long()


# ---------------------------------------------------------------- TRL, without a model or data


def _trl_dpo(pc, pr, rc, rr, beta: float) -> tuple[torch.Tensor, dict]:
    """TRL's DPO ("sigmoid") loss of the pairs: each sequence log-probability is handed to
    ``DPOTrainer._compute_loss`` as the one scored token of a two-token sequence."""
    from trl import DPOTrainer

    n = pc.shape[0]
    token_logps = torch.cat([pc, pr])[:, None]  # (2N, 1): the model's per-token log-probs
    mask = torch.tensor([[0, 1]]).repeat(2 * n, 1)  # the second token is the completion
    zeros = torch.zeros_like(token_logps)
    output = SimpleNamespace(log_probs=token_logps, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())
    trainer = bare_trainer(DPOTrainer, model=EvalModel(output), aux_loss_enabled=False, ld_alpha=None,
                    precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=["sigmoid"],
                    loss_weights=[1.0], beta=beta, label_smoothing=0.0, use_weighting=False,
                    _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(2 * n, 2, dtype=torch.long),
              "attention_mask": torch.ones(2 * n, 2, dtype=torch.long),
              "completion_mask": mask, "ref_chosen_logps": rc, "ref_rejected_logps": rr}
    loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    return loss, trainer._metrics["eval"]


def _trl_ppo(logprobs, old, advantages, mask, eps: float) -> torch.Tensor:
    """TRL's GRPO loss with ``loss_type="bnpo"``, beta = 0 and per-token advantages: PPO's
    token-mean clipped surrogate, computed by ``GRPOTrainer._compute_loss``."""
    from trl import GRPOTrainer

    width = logprobs.shape[1]
    trainer = bare_trainer(
        GRPOTrainer, model=EvalModel(), aux_loss_enabled=False, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level="token", beta=0.0,
        loss_type="bnpo", epsilon_low=eps, epsilon_high=eps, use_vllm=False,
        vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False,
        max_completion_length=width, args=SimpleNamespace(use_bias_correction_kl=False, delta=None))
    trainer._get_per_token_logps_and_entropies = \
        lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None)
    inputs = {"prompt_ids": torch.zeros(logprobs.shape[0], 2, dtype=torch.long),
              "prompt_mask": torch.ones(logprobs.shape[0], 2, dtype=torch.long),
              "completion_ids": torch.zeros(logprobs.shape, dtype=torch.long),
              "completion_mask": mask, "advantages": advantages, "old_per_token_logps": old}
    return trainer._compute_loss(trainer.model, inputs)


# ---------------------------------------------------------------- 1. completion log-probabilities


def _tiny_lm(seed: int, vocab: int = 23):
    from llmbook.transformer.model import TransformerConfig, TransformerLM

    config = TransformerConfig.llama_style(vocab_size=vocab, d_model=16, n_layers=1, n_heads=2,
                                           max_seq_len=16)
    return TransformerLM(config, generator=_gen(seed)).double()


def exercise_1_completion_logprobs(solutions) -> None:
    B, T, V = 3, 7, 11
    g = _gen(0)
    logits = 3 * torch.randn(B, T, V, generator=g, dtype=f64)
    ids = torch.randint(0, V, (B, T), generator=g)
    # prompts of 2, 4 and 1 tokens, completions of 3, 3 and 6, right padding after them
    mask = _ragged_mask([3, 3, 6], T, 0)
    mask[0] = _ragged_mask([3], T, 2)[0]
    mask[1] = _ragged_mask([3], T, 4)[0]
    mask[2] = _ragged_mask([6], T, 1)[0]
    got = solutions.completion_logprobs(logits, ids, mask.bool())
    assert tuple(got.shape) == (B,), f"expected one log-probability per sequence, shape ({B},), got {tuple(got.shape)}"
    labels = ids.masked_fill(mask == 0, -100)[:, 1:]  # the Hugging Face convention
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels.reshape(-1), reduction="none")
    want = -nll.view(B, T - 1).sum(1)
    err = _largest(got, want)
    assert err <= 1e-12, (
        f"expected minus F.cross_entropy summed over the completion (labels -100 elsewhere, logits "
        f"at t - 1 scoring the token at t) = {want.tolist()}, to 1e-12; got {got.tolist()} "
        f"(largest difference {err:.3g})")
    again = solutions.completion_logprobs(logits, ids, mask)  # a 0/1 integer mask works alike
    assert _largest(again, want) <= 1e-12, (
        f"expected the same answer with a 0/1 integer mask as with a boolean one, got {again.tolist()}")
    # a forbidden token (logit -inf) at a masked-out position must not turn the sum into NaN
    blocked = logits.clone()
    blocked[0, 0, ids[0, 1]] = float("-inf")  # position 1 of row 0 is prompt: masked out
    safe = solutions.completion_logprobs(blocked, ids, mask)
    assert bool(torch.isfinite(safe).all()) and _largest(safe, want) <= 1e-12, (
        f"expected a -inf logit at a masked-out position to change nothing ({want.tolist()}), "
        f"got {safe.tolist()}: select with torch.where instead of multiplying by the mask "
        f"(-inf * 0 is NaN)")
    # the book's sequence log-probabilities of responses on a real (tiny) model
    from llmbook.alignment.dpo import sequence_logprobs

    model = _tiny_lm(1)
    prompts = torch.randint(0, 23, (2, 5), generator=g)
    responses = torch.randint(0, 23, (2, 4), generator=g)
    full = torch.cat([prompts, responses], 1)
    with torch.no_grad():
        got = solutions.completion_logprobs(model(full), full, _ragged_mask([4, 4], 9, 5))
        want = sequence_logprobs(model, prompts, responses)
    err = _largest(got, want)
    assert err <= 1e-12, (
        f"expected the book's sequence_logprobs of 4-token responses after 5-token prompts on a "
        f"tiny transformer, {want.tolist()}, to 1e-12; got {got.tolist()} (largest difference {err:.3g})")
    logits.requires_grad_(True)
    solutions.completion_logprobs(logits, ids, mask).sum().backward()
    assert logits.grad is not None and bool(torch.isfinite(logits.grad).all()), (
        "expected the answer to be differentiable in the logits, with a finite gradient")


# ---------------------------------------------------------------- 2. DPO


def exercise_2_dpo_loss(solutions) -> None:
    from llmbook.alignment.losses import dpo_loss as book_dpo_loss

    n, g = 5, _gen(2)
    pc, pr = -10 - 5 * torch.rand(n, generator=g, dtype=f64), -10 - 5 * torch.rand(n, generator=g, dtype=f64)
    rc, rr = -10 - 5 * torch.rand(n, generator=g, dtype=f64), -10 - 5 * torch.rand(n, generator=g, dtype=f64)
    for beta in (0.1, 0.5):
        loss, chosen, rejected = solutions.dpo_loss(pc, pr, rc, rr, beta)
        theirs, logged = _trl_dpo(pc, pr, rc, rr, beta)
        ours, want_c, want_r = book_dpo_loss(pc, pr, rc, rr, beta)
        assert loss.ndim == 0, f"expected a 0-dimensional loss (the mean over pairs), got shape {tuple(loss.shape)}"
        err = abs(_num(loss) - _num(theirs))
        assert err <= 1e-12, (
            f"expected TRL DPOTrainer's sigmoid loss {_num(theirs)!r} at beta = {beta} (to 1e-12), "
            f"got {_num(loss)!r}")
        assert abs(_num(loss) - _num(ours)) <= 1e-12, (
            f"expected the book's dpo_loss {_num(ours)!r} at beta = {beta}, got {_num(loss)!r}")
        assert _largest(chosen, want_c) <= 1e-12 and _largest(rejected, want_r) <= 1e-12, (
            f"expected the implicit rewards beta (log pi - log pi_ref) = {want_c.tolist()} (chosen) and "
            f"{want_r.tolist()} (rejected), got {chosen.tolist()} and {rejected.tolist()}")
        trl_means = (logged["rewards/chosen"][0], logged["rewards/rejected"][0])
        assert abs(float(chosen.mean()) - trl_means[0]) <= 1e-12 and \
            abs(float(rejected.mean()) - trl_means[1]) <= 1e-12, (
                f"expected the mean implicit rewards TRL logs, {trl_means}, got "
                f"{(float(chosen.mean()), float(rejected.mean()))}")
    # the gradient with respect to the policy's log-probabilities
    x = pc.clone().requires_grad_(True)
    solutions.dpo_loss(x, pr, rc, rr, 0.5)[0].backward()
    y = pc.clone().requires_grad_(True)
    book_dpo_loss(y, pr, rc, rr, 0.5)[0].backward()
    assert x.grad is not None and _largest(x.grad, y.grad) <= 1e-12, (
        f"expected dL/d log pi(y_w) = {y.grad.tolist()}, got "
        f"{None if x.grad is None else x.grad.tolist()}")
    # margins of +-1000: -log sigmoid must not overflow
    big = torch.tensor([0.0, 0.0], dtype=f64)
    pc2, pr2 = torch.tensor([-1.0, -2001.0], dtype=f64), torch.tensor([-2001.0, -1.0], dtype=f64)
    loss, _, _ = solutions.dpo_loss(pc2, pr2, big, big, 0.5)
    theirs, _ = _trl_dpo(pc2, pr2, big, big, 0.5)
    assert torch.isfinite(loss) and abs(_num(loss) - _num(theirs)) <= 1e-9, (
        f"expected a finite loss {_num(theirs)!r} (the mean of 0 and 1000) for margins of +1000 and "
        f"-1000, got {_num(loss)!r}: compute -log sigmoid(u) with F.logsigmoid, not log(sigmoid(u))")


# ---------------------------------------------------------------- 3. GAE


def _torchrl_gae(rewards, values, mask, gamma: float, lam: float):
    """torchrl's GAE on the rows of a right-padded batch, done at each episode's end."""
    from torchrl.objectives.value.functional import generalized_advantage_estimate

    m = mask.bool()
    after = torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], dim=1)
    done = ((m & ~after) | ~m)[..., None]  # an episode ends at its last step; padding is its own
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    g, lmbda = torch.tensor(gamma, dtype=values.dtype), torch.tensor(lam, dtype=values.dtype)
    adv, target = generalized_advantage_estimate(g, lmbda, values[..., None], next_values[..., None],
                                                 rewards[..., None], done, done.clone(), time_dim=-2)
    return adv[..., 0], target[..., 0]


def exercise_3_gae(solutions) -> None:
    from llmbook.alignment.losses import gae as book_gae

    g = _gen(3)
    B, T = 4, 9
    rewards, values = torch.randn(B, T, generator=g, dtype=f64), torch.randn(B, T, generator=g, dtype=f64)
    mask = _ragged_mask([9, 6, 1, 4], T)
    on = mask.bool()
    for gamma, lam in ((1.0, 0.95), (0.9, 0.0), (0.99, 1.0), (0.8, 0.6)):
        adv, ret = solutions.gae(rewards, values, gamma, lam, mask)
        assert tuple(adv.shape) == (B, T) and tuple(ret.shape) == (B, T), (
            f"expected advantages and returns of shape ({B}, {T}), got {tuple(adv.shape)} and {tuple(ret.shape)}")
        want_adv, want_ret = _torchrl_gae(rewards, values, mask, gamma, lam)
        err = max(_largest(adv[on], want_adv[on]), _largest(ret[on], want_ret[on]))
        assert err <= 1e-12, (
            f"expected torchrl's advantages and value targets on the unmasked steps at gamma = {gamma}, "
            f"lam = {lam} (to 1e-12), largest difference {err:.3g}; row 1 (6 steps) should be "
            f"{want_adv[1, :6].tolist()}, got {adv[1, :6].tolist()}")
        book_adv, book_ret = book_gae(rewards, values, gamma, lam, mask=mask)
        err = max(_largest(adv, book_adv), _largest(ret, book_ret))
        assert err <= 1e-12, (
            f"expected the book's gae (zeros on padded steps) at gamma = {gamma}, lam = {lam}, "
            f"largest difference {err:.3g}")
        padded = max(float(adv[~on].abs().max()), float(ret[~on].abs().max()))
        assert padded == 0.0, f"expected exactly 0 on padded steps, found {padded!r}"


# ---------------------------------------------------------------- 4. PPO


def exercise_4_ppo_clip_loss(solutions) -> None:
    from llmbook.alignment.losses import ppo_policy_loss

    g = _gen(4)
    B, T = 3, 5
    base = -torch.randn(B, T, generator=g, dtype=f64).abs()
    old = base + 0.3 * torch.randn(B, T, generator=g, dtype=f64)
    adv = torch.randn(B, T, generator=g, dtype=f64)
    mask = _ragged_mask([5, 2, 4], T)
    for eps in (0.2, 0.1):
        logprobs = base.clone().requires_grad_(True)
        loss = solutions.ppo_clip_loss(logprobs, old, adv, mask, eps)
        assert loss.ndim == 0, f"expected a 0-dimensional loss, got shape {tuple(loss.shape)}"
        theirs = _trl_ppo(base, old, adv, mask, eps)
        err = abs(_num(loss) - _num(theirs))
        assert err <= 1e-12, (
            f"expected TRL GRPOTrainer's bnpo loss (beta = 0: PPO's token-mean clipped surrogate) "
            f"{_num(theirs)!r} at eps = {eps} (to 1e-12), got {_num(loss)!r}")
        loss.backward()
        ref = base.clone().requires_grad_(True)
        ppo_policy_loss(ref, old, adv, mask, eps)[0].backward()
        err = _largest(logprobs.grad, ref.grad) if logprobs.grad is not None else float("inf")
        assert err <= 1e-12, (
            f"expected the gradient of the book's ppo_policy_loss at eps = {eps} (zero on clipped "
            f"tokens and off the mask), largest difference {err:.3g}")
    # the gradient flows through logprobs only
    o, a = old.clone().requires_grad_(True), adv.clone().requires_grad_(True)
    solutions.ppo_clip_loss(base.clone().requires_grad_(True), o, a, mask, 0.2).backward()
    leaked = [name for name, t in (("old_logprobs", o), ("advantages", a))
              if t.grad is not None and bool((t.grad != 0).any())]
    assert not leaked, f"expected no gradient to reach {' and '.join(leaked)}: detach them"


# ---------------------------------------------------------------- 5. end to end


def exercise_5_dpo_training_steps(solutions) -> None:
    from llmbook.alignment.dpo import dpo_step, reference_logprobs

    g = _gen(5)
    N, P, R, V = 3, 4, 5, 23
    prompts = torch.randint(0, V, (N, P), generator=g)
    chosen, rejected = torch.randint(0, V, (N, R), generator=g), torch.randint(0, V, (N, R), generator=g)
    reference = _tiny_lm(6)
    ref_c, ref_r = reference_logprobs(reference, prompts, chosen, rejected)
    mine, book = _tiny_lm(7), _tiny_lm(7)
    opt_mine = torch.optim.AdamW(mine.parameters(), lr=0.05, weight_decay=0.01, foreach=False)
    opt_book = torch.optim.AdamW(book.parameters(), lr=0.05, weight_decay=0.01, foreach=False)
    beta = 0.3
    for step in range(3):
        opt_mine.zero_grad(set_to_none=True)
        loss = solutions.dpo_batch_loss(mine, prompts, chosen, rejected, ref_c, ref_r, beta)
        assert loss.ndim == 0 and loss.requires_grad, (
            f"expected a 0-dimensional loss differentiable in the policy at step {step}, got shape "
            f"{tuple(loss.shape)}, requires_grad={loss.requires_grad}")
        loss.backward()
        opt_mine.step()
        want = dpo_step(book, opt_book, prompts, chosen, rejected, ref_c, ref_r, beta)["loss"]
        assert abs(_num(loss) - want) <= 1e-12, (
            f"expected the book's DPO loss {want!r} at step {step} (to 1e-12), got {_num(loss)!r}")
        ours, theirs = dict(mine.named_parameters()), dict(book.named_parameters())
        err, where = max((_largest(ours[k].detach(), theirs[k].detach()), k) for k in theirs)
        assert err <= 1e-10, (
            f"expected the parameters after AdamW step {step} to match the book's dpo_step to 1e-10, "
            f"{where} differs by {err:.3g}")
    moved = max(_largest(p.detach(), q.detach()) for p, q in zip(mine.parameters(), _tiny_lm(7).parameters(),
                                                                  strict=True))
    assert moved > 1e-3, f"expected three steps to move the parameters, they moved by at most {moved:.3g}"
