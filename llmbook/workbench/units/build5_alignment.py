"""Build it yourself, Part V (alignment): log-probabilities of completions, DPO, GAE, PPO.

Part V of the book (chapters 17 to 20: supervised fine-tuning and reward models, RLHF
with PPO, DPO, GRPO) turns a pretrained model into an assistant. Every method there is
built from the same few pieces: the log-probability that the policy gives a completion,
a loss on pairs of completions (DPO), advantages from rewards and values (GAE) and the
clipped surrogate of PPO. In this unit you write those pieces yourself, as plain
functions of tensors, and the grader compares each with the code the field trains with:
TRL's ``DPOTrainer`` and ``GRPOTrainer`` (their own loss code, run on your inputs),
torchrl's generalised advantage estimate, ``torch.nn.functional.cross_entropy``, and the
book's own implementations. Everything is checked in float64, so the tolerances are tight
(each docstring says which).

Build in this order:

1. :func:`completion_logprobs`: the summed log-probability of each completion, with the
   shift by one and a loss mask;
2. :func:`dpo_loss`: the DPO loss of preference pairs and its implicit rewards;
3. :func:`gae`: generalised advantage estimates and returns;
4. :func:`ppo_clip_loss`: PPO's clipped surrogate as a loss.

Exercise 5 puts 1 and 2 together: :func:`dpo_batch_loss` scores pairs with a real
(tiny) transformer, and the grader trains it for three steps with your loss and with the
book's ``dpo_step``; the parameters must agree.

Grade with ``llmbook grade build-V``. This file is the reference: every function calls the
book's own implementation (``llmbook.alignment.logprobs``, ``llmbook.alignment.losses``,
``llmbook.alignment.dpo``), so look at it only after trying.
"""

from __future__ import annotations

import torch


def completion_logprobs(logits: torch.Tensor, input_ids: torch.Tensor,
                        completion_mask: torch.Tensor) -> torch.Tensor:
    """The log-probability of each sequence's completion: log pi(y | x), shape (B,).

    Shapes: ``logits`` (B, T, V), the output of a causal language model run on
    ``input_ids`` (B, T), prompt and completion concatenated; ``completion_mask`` (B, T),
    boolean or 0/1, marks the completion tokens to score (1) and the prompt and padding
    (0). The logits at position t predict the token at position t + 1, so

        out[b] = sum over t = 1 .. T-1 of completion_mask[b, t] * log softmax(logits[b, t-1])[input_ids[b, t]].

    Position 0 is never scored (nothing predicts it): its mask entry is ignored. Return a
    tensor of the logits' dtype, differentiable in the logits.

    Use a stable log-softmax (subtract each row's maximum, or ``torch.log_softmax``).
    Masked-out positions must contribute exactly 0, even where their log-probability is
    -inf (a logit of -inf, a token the model forbids): select with ``torch.where`` rather
    than multiplying by the mask, since -inf * 0 is NaN.

    Checked against ``torch.nn.functional.cross_entropy`` with labels -100 off the
    completion (the Hugging Face convention), and against the book's
    ``llmbook.alignment.dpo.sequence_logprobs`` on a tiny transformer, in float64, to
    1e-12 absolute.
    """
    from llmbook.alignment.logprobs import masked_sum, token_logprobs

    per_token = token_logprobs(logits[:, :-1], input_ids[:, 1:])  # (B, T - 1)
    return masked_sum(per_token, completion_mask[:, 1:], dim=1)  # (B,)


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DPO loss of N preference pairs: (loss, chosen_rewards, rejected_rewards).

    All four inputs are sequence log-probabilities of shape (N,): log pi(y_w | x) and
    log pi(y_l | x) under the policy being trained and under the frozen reference. With the
    implicit rewards

        r_w = beta (log pi(y_w | x) - log pi_ref(y_w | x)),   r_l likewise for y_l,

    the loss of a pair is -log sigmoid(r_w - r_l) (Rafailov et al., 2023, eq. 7), and
    ``loss`` is its mean over the N pairs, a 0-dimensional tensor differentiable in the
    policy's log-probabilities. ``chosen_rewards`` and ``rejected_rewards`` are r_w and r_l,
    (N,), detached (for monitoring).

    -log sigmoid(u) = log(1 + exp(-u)) overflows for large negative u if computed as
    written: use ``torch.nn.functional.logsigmoid`` (or softplus(-u)), so that a pair with a
    margin of -1000 gives a loss of 1000, not inf.

    Checked against TRL's ``DPOTrainer`` (its ``"sigmoid"`` loss, run on your inputs) and the
    book's ``llmbook.alignment.losses.dpo_loss``, in float64, to 1e-12 absolute, including
    pairs with margins of +-1000.
    """
    from llmbook.alignment.losses import dpo_loss as book_dpo_loss

    return book_dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                         ref_rejected_logps, beta)


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float,
        mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns of a batch of episodes: (advantages, returns).

    Shapes: ``rewards``, ``values`` and ``mask`` are (B, T), one row per episode (a
    response), one column per step (a token); ``mask`` (boolean or 0/1) is 1 on the steps of
    the episode and 0 on the right padding after it. Work backwards from the last step
    with V_{t+1} = 0 after the episode's last step (the episode ends there):

        delta_t = r_t + gamma V_{t+1} - V_t,
        A_t     = delta_t + gamma lam A_{t+1},        A = 0 after the last step,
        R_t     = A_t + V_t                           (the value targets).

    On padded steps (mask 0) both outputs are exactly 0, and nothing flows backwards
    across them: the value and the advantage of a padded step count as 0 for the step
    before it. lam = 0 gives the one-step TD errors, lam = 1 the discounted return-to-go
    minus V_t. Return two tensors of the rewards' shape and dtype.

    Checked against torchrl's ``generalized_advantage_estimate`` (on the unmasked steps,
    episodes ending where the mask does) and the book's ``llmbook.alignment.losses.gae``,
    in float64, to 1e-12 absolute, for several (gamma, lam) including 0 and 1.
    """
    from llmbook.alignment.losses import gae as book_gae

    return book_gae(rewards, values, gamma, lam, mask=mask)


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """PPO's clipped surrogate objective, negated into a loss: a 0-dimensional tensor.

    Shapes: ``logprobs`` (B, T), the current policy's log-probabilities of the sampled
    tokens (differentiable); ``old_logprobs`` (B, T), the same under the policy that
    sampled them (a constant); ``advantages`` (B, T) per token (a constant); ``mask``
    (B, T), boolean or 0/1, the completion tokens. With the ratio
    rho_t = exp(logprobs_t - old_logprobs_t),

        loss_t = max(-rho_t A_t, -clip(rho_t, 1 - eps, 1 + eps) A_t)

    (Schulman et al., 2017, eq. 7, with the sign turned so that it is minimised), and the
    answer is the mean of loss_t over the unmasked tokens of the whole batch (every token
    weighs alike, whatever its sequence's length). Detach ``old_logprobs`` and
    ``advantages`` so that the gradient flows only through ``logprobs``.

    The maximum of the two terms (the minimum of the objectives) is the point: it takes
    the clipped term only where clipping makes the update more pessimistic.

    Checked against TRL's ``GRPOTrainer`` loss with ``loss_type="bnpo"`` and beta = 0 (which
    is exactly this token-mean clipped surrogate) and the book's
    ``llmbook.alignment.losses.ppo_policy_loss``, in float64, to 1e-12 absolute, value and
    gradient.
    """
    from llmbook.alignment.losses import ppo_policy_loss

    loss, _ = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps)
    return loss


def dpo_batch_loss(policy: torch.nn.Module, prompts: torch.Tensor, chosen: torch.Tensor,
                   rejected: torch.Tensor, ref_chosen_logps: torch.Tensor,
                   ref_rejected_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """The mean DPO loss of N pairs scored by a causal language model: a 0-dimensional tensor.

    ``policy`` maps token ids (B, T) to next-token logits (B, T, V). ``prompts`` (N, P),
    ``chosen`` and ``rejected`` (N, R) are token ids (every prompt has P tokens and every
    response R; no padding); ``ref_chosen_logps`` and ``ref_rejected_logps`` (N,) are the
    frozen reference's log pi_ref(y_w | x) and log pi_ref(y_l | x), computed beforehand.

    Build it from your own pieces: run the policy on the sequences [x; y_w] and [x; y_l]
    (N, P + R) (both halves in one call of 2N rows, or two calls), score each completion
    with :func:`completion_logprobs` (the mask is 1 on the R response positions), and pass
    the four sequence log-probabilities to :func:`dpo_loss`. Return its loss, which must be
    differentiable in the policy's parameters.

    The grader trains a tiny float64 transformer for three AdamW steps with your loss and,
    from the same start, with the book's ``llmbook.alignment.dpo.dpo_step``: the losses must
    agree to 1e-12 and the parameters to 1e-10 absolute after every step.
    """
    from llmbook.alignment.dpo import dpo_batch_loss as book_dpo_batch_loss

    return book_dpo_batch_loss(policy, prompts, chosen, rejected, ref_chosen_logps,
                               ref_rejected_logps, beta).loss
