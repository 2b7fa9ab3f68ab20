"""Checks of the build-it-yourself unit of Part III (training), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the reader's functions as ``solutions.name(...)``
and compares them, in float64 and on shapes where no two sizes are equal, with the code
that models are trained with: ``torch.nn.functional.cross_entropy`` and ``torch.autograd``
(the loss and its gradients), ``torch.nn.utils.clip_grad_norm_``, PyTorch's
``CosineAnnealingLR`` and ``torch.optim.AdamW``, and with the book's ``cosine_schedule``,
which ``tests/test_optim.py`` ties to Hugging Face's
``get_cosine_with_min_lr_schedule_with_warmup`` at every step (importing
``transformers.optimization`` takes seconds, too long for a check). The last exercise
trains the book's ``TransformerLM`` for ten steps with the reader's parts and with
PyTorch's, and compares the parameters.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from llmbook.workbench.checks import raises

#: number: (stars, title), in the order of building.
EXERCISES = {
    1: (1, "Cross-entropy, the mean over the targets that count"),
    2: (2, "The gradient of cross-entropy with respect to the logits, by hand"),
    3: (1, "The backward pass of a linear layer"),
    4: (1, "Gradient clipping by global norm"),
    5: (1, "The cosine schedule with linear warmup"),
    6: (2, "AdamW, step for step with torch.optim.AdamW"),
    7: (2, "End to end: ten training steps of a tiny transformer"),
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logits_and_targets(shape: tuple[int, ...], V: int, seed: int, ignore_index: int = -100,
                        n_ignored: int = 3, scale: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random float64 logits (*shape, V) and targets (*shape) with ``n_ignored`` ignored."""
    g = _gen(seed)
    z = scale * torch.randn(*shape, V, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, shape, generator=g)
    if ignore_index >= 0:  # an id that is a real token: keep it out of the counted targets
        y = torch.where(y == ignore_index, (y + 1) % V, y)
    flat = y.reshape(-1)
    flat[torch.randperm(flat.numel(), generator=g)[:n_ignored]] = ignore_index
    return z, y


def _largest(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


# ---------------------------------------------------------------- 1. cross-entropy


def exercise_1_cross_entropy(solutions) -> None:
    cases = [
        ("(4, 6) logits of V = 11, 3 ignored", (4, 6), 11, -100, 3, 2.0),
        ("(3, 5) logits of V = 13, none ignored", (3, 5), 13, -100, 0, 2.0),
        ("(2, 3, 7) logits of V = 9, ignore_index = 4", (2, 3, 7), 9, 4, 5, 2.0),
        ("(5, 7) logits of size 10^4", (5, 7), 17, -100, 2, 1e4),
    ]
    for what, shape, V, ignore, n_ignored, scale in cases:
        z, y = _logits_and_targets(shape, V, seed=len(shape) + V, ignore_index=ignore,
                                   n_ignored=n_ignored, scale=scale)
        want = F.cross_entropy(z.reshape(-1, V), y.reshape(-1), ignore_index=ignore)
        got = solutions.cross_entropy(z, y, ignore)
        assert got.ndim == 0, (
            f"expected a scalar (0-dimensional tensor) for {what}, got shape {tuple(got.shape)}")
        assert got.dtype == torch.float64, f"expected float64 for float64 logits ({what}), got {got.dtype}"
        error = abs(float(got) - float(want))
        assert error <= 1e-12 * max(1.0, abs(float(want))), (
            f"expected the mean cross-entropy {float(want)!r} of F.cross_entropy for {what} "
            f"(to 1e-12 relative), got {float(got)!r}"
            + (": with logits this large, subtract each row's maximum before exp" if scale > 100
               else "; the mean is over the targets that are not ignore_index" if n_ignored else ""))
    z, y = _logits_and_targets((2, 3), 5, seed=7)
    with raises(ValueError, what="cross_entropy with every target equal to ignore_index"):
        solutions.cross_entropy(z, torch.full_like(y, -100))


# ---------------------------------------------------------------- 2. its gradient


def exercise_2_cross_entropy_backward(solutions) -> None:
    cases = [
        ("(4, 6) logits of V = 11, 3 ignored", (4, 6), 11, -100, 3),
        ("(2, 3, 7) logits of V = 9, ignore_index = 4, 5 ignored", (2, 3, 7), 9, 4, 5),
        ("(5,) logits of V = 13, none ignored", (5,), 13, -100, 0),
    ]
    for what, shape, V, ignore, n_ignored in cases:
        z, y = _logits_and_targets(shape, V, seed=3 * len(shape) + V, ignore_index=ignore,
                                   n_ignored=n_ignored)
        leaf = z.clone().requires_grad_()
        (want,) = torch.autograd.grad(
            F.cross_entropy(leaf.reshape(-1, V), y.reshape(-1), ignore_index=ignore), leaf)
        got = solutions.cross_entropy_backward(z, y, ignore)
        assert got.shape == z.shape, (
            f"expected a gradient of the logits' shape {tuple(z.shape)} for {what}, got {tuple(got.shape)}")
        ignored = y == ignore
        if n_ignored:
            leak = float(got[ignored].abs().max())
            assert leak == 0.0, (
                f"expected zero gradient at the ignored positions ({what}), got entries up to {leak:.3g}")
        error = _largest(got, want)
        n = int((~ignored).sum())
        assert error <= 1e-14, (
            f"expected the gradient of torch.autograd on F.cross_entropy for {what} (to 1e-14), "
            f"largest difference {error:.3g}; it is (softmax(z) - one_hot(y)) / N, with N = {n} the "
            f"number of targets that are not ignore_index (of {y.numel()} positions)")
    z = torch.tensor([[1000.0, 0.0, -1000.0], [0.0, 1000.0, 999.0]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    got = solutions.cross_entropy_backward(z, y)
    assert torch.isfinite(got).all(), (
        f"expected a finite gradient for logits of size 1000, got {got.tolist()}: subtract "
        f"each row's maximum before exp")
    z, y = _logits_and_targets((2, 3), 5, seed=8)
    with raises(ValueError, what="cross_entropy_backward with every target equal to ignore_index"):
        solutions.cross_entropy_backward(z, torch.full_like(y, -100))


# ---------------------------------------------------------------- 3. linear backward


def exercise_3_linear_backward(solutions) -> None:
    g = _gen(30)
    d_in, d_out = 7, 4
    W = torch.randn(d_out, d_in, generator=g, dtype=torch.float64)
    b = torch.randn(d_out, generator=g, dtype=torch.float64)
    for lead in ((5,), (2, 3)):
        x = torch.randn(*lead, d_in, generator=g, dtype=torch.float64)
        G = torch.randn(*lead, d_out, generator=g, dtype=torch.float64)
        xs, Ws, bs = (t.clone().requires_grad_() for t in (x, W, b))
        want = torch.autograd.grad((F.linear(xs, Ws, bs) * G).sum(), (xs, Ws, bs))
        got = solutions.linear_backward(x, W, G)
        for name, a, w in zip(("grad_x", "grad_W", "grad_b"), got, want, strict=True):
            assert a.shape == w.shape, (
                f"expected {name} of shape {tuple(w.shape)} for x of shape {tuple(x.shape)} and W of "
                f"shape {tuple(W.shape)}, got {tuple(a.shape)}")
            error = _largest(a, w)
            assert error <= 1e-12, (
                f"expected {name} to equal torch.autograd's for x of shape {tuple(x.shape)} (to 1e-12), "
                f"largest difference {error:.3g}"
                + ("; parameter gradients are sums over the batch positions, not means"
                   if name != "grad_x" else ""))


# ---------------------------------------------------------------- 4. clipping


def exercise_4_clip_grad_norm(solutions) -> None:
    g = _gen(40)
    shapes = [(3, 5), (7,), (4, 2, 3)]
    base = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
    norm = float(torch.sqrt(sum((t * t).sum() for t in base)))
    for max_norm, eps in ((1.0, 1e-6), (0.5 * norm, 1e-6), (2.0 * norm, 1e-6), (1.0, 0.5)):
        params = [torch.zeros_like(t, requires_grad=True) for t in base]
        for p, t in zip(params, base, strict=True):
            p.grad = t.clone()
        want_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))  # eps 1e-6 built in
        if eps != 1e-6:  # torch has no eps argument: the same rule by hand
            scale = min(1.0, max_norm / (norm + eps))
            want = [t * scale for t in base]
        else:
            want = [p.grad for p in params]
        clipped, got_norm = solutions.clip_grad_norm([t.clone() for t in base], max_norm, eps)
        assert abs(got_norm - want_norm) <= 1e-12 * want_norm, (
            f"expected the global norm before clipping, {want_norm!r} (the square root of the sum "
            f"of every entry squared, over all tensors), got {got_norm!r}")
        assert len(clipped) == len(base), f"expected {len(base)} clipped tensors, got {len(clipped)}"
        for i, (a, w) in enumerate(zip(clipped, want, strict=True)):
            assert a.shape == w.shape, f"expected tensor {i} of shape {tuple(w.shape)}, got {tuple(a.shape)}"
            error = _largest(a, w)
            assert error <= 1e-12 * float(w.abs().max()), (
                f"expected tensor {i} scaled as torch.nn.utils.clip_grad_norm_ scales it, by "
                f"min(1, max_norm / (norm + eps)) with max_norm = {max_norm:.6g}, norm = {norm:.6g}, "
                f"eps = {eps:g} (to 1e-12 relative), largest difference {error:.3g}")


# ---------------------------------------------------------------- 5. schedule


def exercise_5_cosine_schedule(solutions) -> None:
    from llmbook.training.optim import cosine_schedule

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-12 * abs(b) + 1e-18

    for max_lr, min_lr, W, N in ((3e-3, 2e-4, 7, 53), (1.0, 0.0, 5, 20), (6e-4, 6e-5, 0, 9),
                                 (1e-2, 1e-3, 6, 6)):
        got = [solutions.cosine_schedule(s, max_lr, min_lr, W, N) for s in range(N + 5)]
        for s, lr in enumerate(got):
            book = cosine_schedule(s, max_lr, min_lr, W, N)
            assert close(float(lr), book), (
                f"expected lr({s}) = {book!r} for max_lr = {max_lr}, min_lr = {min_lr}, "
                f"warmup {W}, total {N} (the book's cosine_schedule, to 1e-12 relative), got {lr!r}")
        if W < N:  # the decay is PyTorch's CosineAnnealingLR started at step W
            opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=max_lr)
            cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=N - W, eta_min=min_lr)
            for s in range(W, N + 1):
                want = cos.get_last_lr()[0]
                assert close(got[s], want), (
                    f"expected lr({s}) = {want!r}, where torch's CosineAnnealingLR from max_lr = "
                    f"{max_lr} to min_lr = {min_lr} over {N - W} steps is after {s - W} steps "
                    f"(warmup {W}, total {N}; to 1e-12 relative), got {got[s]!r}")
                opt.step()
                cos.step()
    # the pinned points, from the formula
    max_lr, min_lr, W, N = 6e-4, 6e-5, 100, 1100
    pinned = {0: 0.0, 50: 3e-4, 100: max_lr, 600: (max_lr + min_lr) / 2, 1100: min_lr, 5000: min_lr}
    for s, want in pinned.items():
        lr = solutions.cosine_schedule(s, max_lr, min_lr, W, N)
        assert close(lr, want), (
            f"expected lr({s}) = {want!r} with warmup {W} and total {N} (0 at the start, max_lr at "
            f"the end of warmup, the midpoint halfway through the decay, min_lr from the end on), got {lr!r}")
    with raises(ValueError, what="cosine_schedule with warmup_steps > total_steps"):
        solutions.cosine_schedule(3, 1.0, 0.1, 10, 5)
    with raises(ValueError, what="cosine_schedule with min_lr > max_lr"):
        solutions.cosine_schedule(3, 0.1, 1.0, 2, 5)


# ---------------------------------------------------------------- 6. AdamW


def exercise_6_adamw_step(solutions) -> None:
    shapes = [(3, 5), (7,), (4, 2, 3)]
    configs = [
        ("weight_decay 0.1", dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), 1.0),
        ("weight_decay 0, eps 1e-3, betas (0.8, 0.95)",
         dict(betas=(0.8, 0.95), eps=1e-3, weight_decay=0.0), 1e-2),
        ("weight_decay 0.5, eps 1e-3", dict(betas=(0.85, 0.99), eps=1e-3, weight_decay=0.5), 1e-2),
    ]
    for what, kw, grad_scale in configs:
        g = _gen(60)
        start = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
        ref = [t.clone().requires_grad_() for t in start]
        opt = torch.optim.AdamW(ref, lr=1e-2, amsgrad=False, foreach=False, **kw)
        mine = [t.clone() for t in start]
        m = [torch.zeros_like(t) for t in start]
        v = [torch.zeros_like(t) for t in start]
        for t in range(1, 21):
            lr = 1e-2 * (1 + 0.5 * math.sin(t))  # a new rate every step, as under a schedule
            grads = [grad_scale * torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
            grads[1] = torch.zeros_like(grads[1])  # parameter 1: only the decay moves it
            for group in opt.param_groups:
                group["lr"] = lr
            for p, gr in zip(ref, grads, strict=True):
                p.grad = gr.clone()
            opt.step()
            for i, gr in enumerate(grads):
                mine[i], m[i], v[i] = solutions.adamw_step(mine[i], gr.clone(), m[i], v[i], t, lr,
                                                           kw["betas"], kw["eps"], kw["weight_decay"])
            for i in (1, 0, 2):  # the zero-gradient parameter first: it shows the decay alone
                p, state = ref[i], opt.state[ref[i]]
                for name, a, w in (("the values", mine[i], p.detach()),
                                   ("exp_avg (m)", m[i], state["exp_avg"]),
                                   ("exp_avg_sq (v)", v[i], state["exp_avg_sq"])):
                    assert a.shape == w.shape, (
                        f"expected {name} of shape {tuple(w.shape)}, got {tuple(a.shape)} ({what})")
                    error = _largest(a, w)
                    size = float(w.abs().max())
                    assert error <= 1e-12 * max(size, 1e-300), (
                        f"expected {name} of parameter {i} (shape {tuple(w.shape)}) after step {t} to "
                        f"equal torch.optim.AdamW's ({what}; to 1e-12 relative), largest difference "
                        f"{error:.3g} of {size:.3g}"
                        + (": with a zero gradient only the decoupled decay, theta (1 - lr lambda), may "
                           "move it; lambda theta is not added to the gradient"
                           if i == 1 and name == "the values"
                           else ": at step 1 the bias corrections divide m by 1 - beta1 and v by "
                           "1 - beta2, and eps is added to sqrt(v_hat)"
                           if t == 1 else ""))


# ---------------------------------------------------------------- 7. end to end


def exercise_7_end_to_end_training(solutions) -> None:
    from llmbook.training.optim import cosine_schedule
    from llmbook.transformer.model import TransformerConfig, TransformerLM

    V, T, B, steps = 23, 9, 3, 10
    max_lr, min_lr, warmup, total, max_norm = 2e-2, 2e-3, 3, 8, 1.12  # clips some steps
    betas, eps, wd = (0.9, 0.95), 1e-8, 0.1
    c = TransformerConfig.llama_style(vocab_size=V, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                                      d_ff=40, max_seq_len=T, tie_embeddings=False)
    ref_model = TransformerLM(c, generator=_gen(70)).double()
    g = _gen(71)
    bias = 0.1 * torch.randn(V, generator=g, dtype=torch.float64)  # a head with a bias: b is trained too
    data = torch.randint(0, V, (steps, B, T + 1), generator=g)
    batches = []
    for k in range(steps):
        x, y = data[k, :, :-1], data[k, :, 1:].clone()
        y[k % B, : 2 + k % 3] = -100  # some ignored targets, a different number each step
        batches.append((x, y))
    my_model = copy.deepcopy(ref_model)
    ref_bias, my_bias = bias.clone().requires_grad_(), bias.clone().requires_grad_()
    ref_params = [*ref_model.parameters(), ref_bias]
    my_params = [*my_model.parameters(), my_bias]
    names = [n for n, _ in ref_model.named_parameters()] + ["head bias"]
    head = my_model.lm_head.weight

    opt = torch.optim.AdamW(ref_params, lr=max_lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)
    ref_lrs, ref_norms, after = [], [], []
    for s, (x, y) in enumerate(batches):
        ref_lrs.append(cosine_schedule(s, max_lr, min_lr, warmup, total))
        for group in opt.param_groups:
            group["lr"] = ref_lrs[-1]
        opt.zero_grad()
        F.cross_entropy((ref_model(x) + ref_bias).reshape(-1, V), y.reshape(-1)).backward()
        ref_norms.append(float(torch.nn.utils.clip_grad_norm_(ref_params, max_norm)))
        opt.step()
        after.append([p.detach().clone() for p in ref_params])

    m = [torch.zeros_like(p) for p in my_params]
    v = [torch.zeros_like(p) for p in my_params]
    for s, (x, y) in enumerate(batches):
        lr = solutions.cosine_schedule(s, max_lr, min_lr, warmup, total)
        assert abs(lr - ref_lrs[s]) <= 1e-12 * ref_lrs[s], (
            f"expected the learning rate {ref_lrs[s]!r} at step {s} (warmup {warmup}, total {total}), "
            f"got {lr!r} from your cosine_schedule")
        for p in my_params:
            p.grad = None
        h = my_model.hidden_states(x)  # (B, T, d): autograd from here down
        hd = h.detach()
        logits = hd @ head.detach().T + my_bias.detach()  # (B, T, V): the head, by hand
        loss = float(solutions.cross_entropy(logits, y))
        want = float(F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)))
        assert abs(loss - want) <= 1e-12 * want, (
            f"expected the loss {want!r} of F.cross_entropy at step {s} (to 1e-12 relative), got "
            f"{loss!r} from your cross_entropy")
        grad_logits = solutions.cross_entropy_backward(logits, y)
        grad_h, grad_W, grad_b = solutions.linear_backward(hd, head.detach(), grad_logits)
        for what, got, like in (("cross_entropy_backward", grad_logits, logits), ("grad_x", grad_h, hd),
                                ("grad_W", grad_W, head), ("grad_b", grad_b, my_bias)):
            assert got.shape == like.shape, (
                f"expected {what} of shape {tuple(like.shape)} at step {s}, got {tuple(got.shape)}")
        h.backward(grad_h)  # the rest of the network by autograd
        head.grad, my_bias.grad = grad_W, grad_b
        clipped, norm = solutions.clip_grad_norm([p.grad for p in my_params], max_norm)
        assert abs(norm - ref_norms[s]) <= 1e-8 * ref_norms[s], (
            f"expected the gradient norm {ref_norms[s]!r} of the loop with autograd at step {s} "
            f"(to 1e-8 relative), got {norm!r}: the gradients from your cross_entropy_backward and "
            f"linear_backward, or the norm of your clip_grad_norm, differ")
        with torch.no_grad():
            for i, p in enumerate(my_params):
                new, m[i], v[i] = solutions.adamw_step(p.detach(), clipped[i], m[i], v[i], s + 1, lr,
                                                       betas, eps, wd)
                p.copy_(new)
        worst, where = 0.0, names[0]
        for name, a, w in zip(names, my_params, after[s], strict=True):
            error = _largest(a.detach(), w)
            if error > worst:
                worst, where = error, name
        assert worst <= 1e-10, (
            f"expected the parameters after step {s} (of 0 to {steps - 1}) with your loss, gradients, "
            f"clipping, schedule and AdamW to equal those of the loop with F.cross_entropy, autograd, "
            f"clip_grad_norm_ and torch.optim.AdamW (to 1e-10), largest difference {worst:.3g} in {where}")
