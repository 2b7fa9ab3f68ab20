"""Build it yourself, Part III (training): the loss, its gradient, clipping, the schedule, AdamW.

Part III of the book (chapters 8 to 10: backpropagation, optimisers, the training loop)
turns a model that computes logits into one that learns. In this unit you write the core
of one training step yourself, as plain functions of tensors and numbers, and the grader
compares each with the code the world trains with: ``torch.nn.functional.cross_entropy``
and ``torch.autograd`` for the loss and its gradients, ``torch.nn.utils.clip_grad_norm_``,
PyTorch's ``CosineAnnealingLR`` and the book's schedule, and ``torch.optim.AdamW`` step for
step. Everything is checked in float64, so the tolerances are tight (each docstring says
which).

Build in this order, each function on its own first:

1. :func:`cross_entropy`: the mean loss over the targets that are not ignored;
2. :func:`cross_entropy_backward`: its gradient with respect to the logits, by hand;
3. :func:`linear_backward`: the three gradients of a linear layer, by hand;
4. :func:`clip_grad_norm`: rescale all gradients together to a maximum global norm;
5. :func:`cosine_schedule`: linear warmup from zero, then half a cosine down to a floor;
6. :func:`adamw_step`: one AdamW update of one parameter, with its two moment buffers.

Exercise 7 uses them all at once: ten steps of a tiny transformer (the book's
``TransformerLM``) in which the loss, the gradient of the output layer, the clipping, the
learning rate and the update are yours, and autograd does only the rest of the network.
Its parameters must follow the same loop written with ``F.cross_entropy``, autograd,
``torch.nn.utils.clip_grad_norm_`` and ``torch.optim.AdamW``.

Start with ``llmbook exercises build-III`` (it writes the stub: this file with every body
replaced by ``raise NotImplementedError``) and grade with ``llmbook grade build-III``. This
file is the reference: every function calls the book's own implementation
(``llmbook.text.functional``, ``llmbook.training.backprop``, ``llmbook.training.optim``),
so look at it only after trying.
"""

from __future__ import annotations

import torch


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """The mean cross-entropy of integer targets, in nats: a scalar tensor.

    Shapes: ``logits`` (..., V) floating, ``targets`` (...) integer token ids, the same
    leading shape. For each position n whose target y_n is not ``ignore_index``,

        loss_n = -log softmax(z_n)[y_n] = logsumexp(z_n) - z_n[y_n],

    and the answer is the mean of loss_n over those positions only (ignored positions count
    neither in the sum nor in the number divided by). Return a 0-dimensional tensor of the
    logits' dtype.

    Logits may be large (thousands): compute logsumexp with the maximum subtracted first,
    logsumexp(z) = m + log sum_i exp(z_i - m) with m = max_i z_i, or exp overflows. When
    every target is ``ignore_index`` there is nothing to average: raise ``ValueError``
    (PyTorch returns nan).

    Checked against ``torch.nn.functional.cross_entropy`` on the flattened inputs, in
    float64, to 1e-12 relative, with and without ignored positions and for logits of size
    10^4.
    """
    from llmbook.text.functional import cross_entropy as book_cross_entropy

    return book_cross_entropy(logits, targets, ignore_index=ignore_index)


def cross_entropy_backward(logits: torch.Tensor, targets: torch.Tensor,
                           ignore_index: int = -100) -> torch.Tensor:
    """The gradient of :func:`cross_entropy` (the mean) with respect to the logits.

    Shapes: ``logits`` (..., V), ``targets`` (...) -> (..., V). With p_n = softmax(z_n),
    e_y the one-hot vector of the target and N the number of targets that are not
    ``ignore_index``:

        dL/dz_n = (p_n - e_{y_n}) / N     at a counted position,
        dL/dz_n = 0                       at an ignored one.

    Derive it yourself (chapter 8): the softmax Jacobian's terms cancel to p - e_y. Use a
    stable softmax (subtract the row's maximum). Every row of the answer sums to zero. When
    every target is ``ignore_index``, raise ``ValueError``.

    Checked against ``torch.autograd`` on ``F.cross_entropy`` in float64, to 1e-14
    absolute, with ignored positions, a custom ``ignore_index`` and an odd shape.
    """
    from llmbook.training.backprop import cross_entropy_backward as book_backward

    return book_backward(logits, targets, ignore_index=ignore_index)


def linear_backward(x: torch.Tensor, W: torch.Tensor,
                    grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of a linear layer y = x W^T + b (``nn.Linear``), given G = dL/dy.

    Shapes: ``x`` (..., d_in), ``W`` (d_out, d_in), ``grad_out`` G (..., d_out), any number
    of leading (batch) dimensions. With X and G flattened to (N, d_in) and (N, d_out) over
    the leading dimensions, return ``(grad_x, grad_W, grad_b)``:

        grad_x = G W          shape (..., d_in)
        grad_W = G^T X        shape (d_out, d_in)
        grad_b = sum_n G_n    shape (d_out,)

    A parameter used at every position receives the sum of its gradients there, so grad_W
    and grad_b are sums over the leading dimensions, not means. The bias does not appear in
    any gradient, so it is not an argument. Hint: check each shape before the numbers.

    Checked against ``torch.autograd`` on ``F.linear`` in float64, to 1e-12 absolute, for
    x of shapes (5, 7) and (2, 3, 7) with d_out = 4.
    """
    from llmbook.training.backprop import linear_backward as book_linear_backward

    return book_linear_backward(x, W, grad_out)


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float,
                   eps: float = 1e-6) -> tuple[list[torch.Tensor], float]:
    """Scale every gradient by one factor so that their global L2 norm is about ``max_norm``.

    ``grads`` is a list of gradient tensors of any shapes (one per parameter). Their global
    norm treats them as one long vector, ||g|| = sqrt(sum over tensors of sum g^2). Every
    tensor is multiplied by

        scale = min(1, max_norm / (||g|| + eps)),

    so nothing changes when ||g|| <= max_norm (up to eps), and otherwise the direction is
    kept and the norm becomes max_norm * ||g|| / (||g|| + eps), just under ``max_norm``.
    Return ``(clipped, norm)``: the list of scaled tensors (same order and shapes) and the
    norm before clipping as a Python float. You may scale the tensors in place or return
    new ones; the check uses only what you return.

    Checked against ``torch.nn.utils.clip_grad_norm_`` (which works in place on the
    parameters' ``.grad``), in float64, to 1e-12 relative, with the norm above and below
    ``max_norm``.
    """
    from llmbook.training.optim import clip_grad_norm_

    params = []
    for g in grads:
        p = torch.zeros_like(g)
        p.grad = g.detach().clone()
        params.append(p)
    norm = clip_grad_norm_(params, max_norm, eps=eps)
    return [p.grad for p in params], float(norm)


def cosine_schedule(step: int, max_lr: float, min_lr: float, warmup_steps: int,
                    total_steps: int) -> float:
    """The learning rate at ``step`` of a linear warmup from zero followed by a cosine decay.

    With s = step, W = warmup_steps, N = total_steps (steps count updates from 0):

        lr(s) = max_lr * s / W                                                  for s < W,
        lr(s) = min_lr + (max_lr - min_lr) / 2 * (1 + cos(pi * (s - W) / (N - W)))  for W <= s < N,
        lr(s) = min_lr                                                          for s >= N.

    So lr(0) = 0, lr(W) = max_lr, halfway through the decay the rate is (max_lr + min_lr) / 2,
    and from s = N on it stays at min_lr. W = 0 means no warmup; W = N means warmup only.
    Raise ``ValueError`` when warmup_steps > total_steps or min_lr > max_lr. Return a float.

    Checked at every step against the book's ``cosine_schedule`` (which the book's tests tie
    to Hugging Face's ``get_cosine_with_min_lr_schedule_with_warmup``) and, over the decay,
    PyTorch's ``CosineAnnealingLR``, to 1e-12 relative, for schedules with and without
    warmup, and at the pinned points above.
    """
    from llmbook.training.optim import cosine_schedule as book_cosine_schedule

    return book_cosine_schedule(step, max_lr, min_lr, warmup_steps, total_steps)


def adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
               exp_avg_sq: torch.Tensor, step: int, lr: float,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 1e-2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW update of one parameter: returns ``(param, exp_avg, exp_avg_sq)`` after it.

    ``param`` theta, ``grad`` g, ``exp_avg`` m and ``exp_avg_sq`` v share one shape; m and v
    are zeros before the first update. ``step`` is t, the number of this update: 1 for the
    first. With (beta1, beta2) = ``betas`` and lambda = ``weight_decay``:

        theta <- theta * (1 - lr * lambda)              decoupled weight decay, first
        m     <- beta1 * m + (1 - beta1) * g
        v     <- beta2 * v + (1 - beta2) * g^2
        m_hat =  m / (1 - beta1^t),   v_hat = v / (1 - beta2^t)      bias correction
        theta <- theta - lr * m_hat / (sqrt(v_hat) + eps)

    The decay multiplies theta directly and is not added to g (adding lambda * theta to g is
    Adam's L2 penalty, a different optimiser); eps is added after the square root of the
    bias-corrected v. You may update the tensors in place or return new ones; the check uses
    only what you return.

    Checked against ``torch.optim.AdamW`` (amsgrad off) step for step for 20 steps, with a
    new learning rate at every step, on three parameters of shapes (3, 5), (7,) and
    (4, 2, 3) (one with a zero gradient, so that only the decay moves it), for
    weight_decay 0.1, 0 and 0.5, and with eps = 1e-3 where it matters: parameters and both
    buffers agree to 1e-12 relative to their size, in float64.
    """
    from llmbook.training.optim import AdamW

    p = param.detach().clone()
    p.grad = grad.detach().clone()
    m, v = exp_avg.detach().clone(), exp_avg_sq.detach().clone()
    optimiser = AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    optimiser.state[p] = {"step": torch.tensor(float(step - 1)), "exp_avg": m, "exp_avg_sq": v}
    optimiser.step()
    p.grad = None
    return p, m, v
