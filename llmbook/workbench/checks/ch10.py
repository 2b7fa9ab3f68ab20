"""Checks of chapter 10's exercises (notebooks/10_training), run on ``solutions``.

Each ``exercise_N_...(solutions)`` calls the answers as ``solutions.name(...)``; the
peers are the recipes of the shipped models, the entropies of the Markov sources
computed here from their stationary laws, the book's ``train_step`` (one full batch),
the shipped synthetic model, Korthikanti et al. (2022)'s equation 1 in SymPy and
autograd through the book's ``z_loss``.
"""

from __future__ import annotations

import copy
import math

import sympy as sp
import torch
from torch import Tensor

from llmbook.text.data import MarkovSource, default_source
from llmbook.text.functional import cross_entropy
from llmbook.training.optim import AdamW
from llmbook.training.pretrained import RECIPES, book_model
from llmbook.training.train import get_batch, param_groups, train_step, z_loss
from llmbook.transformer.model import TransformerConfig, TransformerLM
from llmbook.workbench.checks import raises


def _entropy(p: Tensor) -> float:
    """Shannon entropy (nats) of the probabilities in ``p``, any shape; zeros contribute 0."""
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def exercise_1_tokens_and_epochs(solutions) -> None:
    got = solutions.tokens_and_epochs(600, 128, 16, 1_000_000)
    want = (1_228_800, 1.2288)
    assert got == want, f"expected tokens_and_epochs(600, 128, 16, 1_000_000) = {want}, got {got}"
    t = RECIPES["text"]["train"]
    seen, epochs = solutions.tokens_and_epochs(t["steps"], t["batch_size"], t["context_length"],
                                               470_885)
    assert seen == 4_096_000, f"expected the text model's recipe to see 4,096,000 tokens, got {seen}"
    assert 8.6 < epochs < 8.8, (  # the text model sees its data ~9 times
        f"expected between 8.6 and 8.8 passes over 470,885 tokens, got {epochs}")
    with raises(ValueError, match="num_tokens must be a positive int",
                what="tokens_and_epochs(1, 1, 1, 0)"):
        solutions.tokens_and_epochs(1, 1, 1, 0)


def exercise_2_window_floor_order_two_matches_the_chapter_formula(solutions) -> None:
    src = default_source()
    H = src.entropy_rate()
    pi = src.stationary.reshape(16, 16)
    H1 = _entropy(pi) - _entropy(pi.sum(1))  # H(X_1 | X_0) = H(X_0, X_1) - H(X_0)
    for T in (1, 2, 16, 100):
        got, want = solutions.window_floor(src, T), (H1 + (T - 1) * H) / T
        assert abs(got - want) < 1e-12, (
            f"expected window_floor(source, {T}) = (H1 + (T - 1) H) / T = {want!r} "
            f"(to 1e-12), got {got!r}")
    long = solutions.window_floor(src, 100_000)
    assert abs(long - H) < 2e-5, (
        f"expected window_floor(source, 100_000) within 2e-5 of the entropy rate {H!r}, got {long!r}")
    floors = solutions.per_position_floor(src, 5)
    assert floors[0] > floors[1] == floors[4], (
        f"expected the first floor above the second and the second equal to the fifth, got {floors}")
    assert abs(floors[4] - H) <= 1e-15, (
        f"expected the floor from position 1 on to be the entropy rate {H!r}, got {floors[4]!r}")


def exercise_2_window_floor_order_three_and_iid(solutions) -> None:
    src3 = MarkovSource(vocab_size=3, order=3, concentration=0.5, seed=1)
    floors = solutions.per_position_floor(src3, 4)
    # decreasing conditional entropies, reaching H at t = k - 1 = 2
    assert floors[0] >= floors[1] >= floors[2] - 1e-12, (
        f"expected the order-3 floors not to increase, got {floors}")
    H3 = src3.entropy_rate()
    assert floors[2] == floors[3] == H3, (
        f"expected floors 2 and 3 of an order-3 source to be its entropy rate {H3!r}, got {floors}")
    # brute force for position 1: H(X_2 | X_0, X_1) = H(X_0, X_1, X_2) - H(X_0, X_1)
    joint3 = src3.stationary.reshape(3, 3, 3)
    brute = _entropy(joint3) - _entropy(joint3.sum(2))
    assert abs(floors[1] - brute) < 1e-12, (
        f"expected floor 1 = H(X_0, X_1, X_2) - H(X_0, X_1) = {brute!r} (to 1e-12), got {floors[1]!r}")
    # an i.i.d. "chain" (every row the same) has every floor equal to H
    row = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    iid = MarkovSource.from_transition(row.repeat(9, 1), order=2)
    H_iid = iid.entropy_rate()
    iid_floors = solutions.per_position_floor(iid, 3)
    assert all(abs(f - H_iid) < 1e-12 for f in iid_floors), (
        f"expected every floor of an i.i.d. source to be its entropy {H_iid!r}, got {iid_floors}")
    H_row = _entropy(row)
    assert abs(H_iid - H_row) < 1e-12, (
        f"the i.i.d. source's entropy rate {H_iid!r} is not the entropy of its row {H_row!r}")


def exercise_3_accumulated_step_equals_full_batch_step(solutions) -> None:
    cfg = TransformerConfig.llama_style(vocab_size=16, d_model=24, n_layers=1, n_heads=2,
                                        max_seq_len=12)
    # float64: Adam divides by sqrt(v), which would magnify float32 round-off in tiny gradients
    a = TransformerLM(cfg, generator=torch.Generator().manual_seed(0)).double()
    b = copy.deepcopy(a)
    opt_a = AdamW(param_groups(a, 0.1), lr=1e-2)
    opt_b = AdamW(param_groups(b, 0.1), lr=1e-2)
    tokens = default_source().sample(4_000, seed=5)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x, y = get_batch(tokens, 12, 12, generator=g)
        full, _ = train_step(a, opt_a, x, y, 1e-2, grad_clip=0.5)
        acc = solutions.accumulated_train_step(b, opt_b, x, y, 1e-2, micro_batches=4, grad_clip=0.5)
        assert abs(full.item() - acc.item()) < 1e-12, (
            f"step {step}: expected the accumulated loss to equal the full batch's "
            f"{full.item()!r} (to 1e-12), got {acc.item()!r}")
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        err = float((p - q).detach().abs().max())
        assert err <= 1e-10, (
            f"after 3 steps, expected {name} to equal the full-batch model's to 1e-10, "
            f"got a largest difference of {err:.3g}")
    with raises(ValueError, match="must divide the batch size B=12",
                what="accumulated_train_step(..., micro_batches=5) on a batch of 12"):
        solutions.accumulated_train_step(b, opt_b, x, y, 1e-2, micro_batches=5)


def exercise_4_book_model_per_position_losses_respect_their_floors(solutions) -> None:
    model, _ = book_model("synthetic")
    src = default_source()
    val = src.sample(50_000, seed=77)
    loss = solutions.per_position_loss(model, val, 16, 2_000, torch.Generator().manual_seed(0))
    floors = torch.tensor(solutions.per_position_floor(src, 16), dtype=loss.dtype)
    assert loss.shape == (16,), f"expected 16 per-position losses, got shape {tuple(loss.shape)}"
    ratio = loss[0].item() / floors[0].item()
    assert abs(ratio - 1) < 0.02, (
        f"expected the loss at position 0 within 2% of its floor {floors[0].item():.4f}, "
        f"got {loss[0].item():.4f}")
    noise = 3 / math.sqrt(2_000)  # per-token losses have a standard deviation below 1 nat
    below = [(t, round(loss[t].item(), 4), round(floors[t].item(), 4))
             for t in range(16) if not loss[t] > floors[t] - noise]
    assert not below, (
        f"expected every loss above its floor minus {noise:.3f} (noise), got (position, loss, "
        f"floor) {below}")
    mean = floors.mean().item()
    window = solutions.window_floor(src, 16)
    assert abs(window - mean) < 1e-6, (
        f"expected window_floor(source, 16) = the mean of the per-position floors {mean!r}, "
        f"got {window!r}")
    worst = int((loss - floors).argmax())
    assert worst >= 1, (  # the excess sits where the full context is used
        f"expected the largest excess over the floor at a position >= 1, got position {worst}")


def exercise_5_korthikanti_count_sums_to_the_published_total(solutions) -> None:
    terms = solutions.korthikanti_activation_bytes()
    s, b, h, a = sp.symbols("s b h a", positive=True, integer=True)
    # Korthikanti et al. (2022), equation 1: s b h (34 + 5 a s / h) bytes per layer
    total = sp.simplify(terms["total"] - s * b * h * (34 + 5 * a * s / h))
    assert total == 0, f"expected total - s b h (34 + 5 a s / h) to simplify to 0, got {total}"
    attention = sum(v for k, v in terms.items() if k.startswith("attention"))
    residual = sp.simplify(attention - (11 * s * b * h + 5 * a * s**2 * b))  # their 11sbh + 5as^2b
    assert residual == 0, (
        f"expected the attention terms to sum to 11 s b h + 5 a s^2 b, off by {residual}")
    mlp = sum(v for k, v in terms.items() if k.startswith("MLP"))
    residual = sp.simplify(mlp - 19 * s * b * h)
    assert residual == 0, f"expected the MLP terms to sum to 19 s b h, off by {residual}"


def exercise_5_book_block_in_16_bit_against_korthikanti(solutions) -> None:
    book = solutions.book_block_bytes_16bit()
    s, b, h, a = sp.symbols("s b h a", positive=True, integer=True)
    # the book's block: no dropout masks, unfused LayerNorm and GELU save more, attention
    # weights saved twice; at GPT-2 small's shape, per sequence
    shape = {s: 1024, b: 1, h: 768, a: 12}
    ours = int(book.subs(shape))
    theirs = int(solutions.korthikanti_activation_bytes()["total"].subs(shape))
    want = 2 * 1024 * 768 * 32 + 2 * 12 * 1024**2 * 2 + 4 * 1024 + 1024**2 + 12 * 1024
    assert ours == want, (
        f"expected the book's block at s=1024, b=1, h=768, a=12 to save {want:,} bytes, got {ours:,}")
    ratio = ours / theirs
    assert 1.0 < ratio < 1.5, (
        f"expected the book's block to save 1 to 1.5 times Korthikanti's count, got {ratio:.3f}")


def exercise_6_z_loss_gradient_and_zero_shift(solutions) -> None:
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(3, 5, 7, generator=g, dtype=torch.float64)  # B != T != V
    targets = torch.randint(0, 7, (3, 5), generator=g)
    x = logits.clone().requires_grad_(True)
    z_loss(x).backward()
    grad = solutions.z_loss_gradient(logits)
    assert torch.allclose(grad, x.grad, atol=1e-14, rtol=0), (
        "expected z_loss_gradient(logits) to equal autograd's gradient of z_loss to 1e-14, got a "
        f"largest difference of {float((grad - x.grad).abs().max()):.3g}")
    # summed over the vocabulary: 2 log Z / n per position (a bias shared by all logits)
    want = 2 * torch.logsumexp(logits, -1) / 15
    assert torch.allclose(grad.sum(-1), want, atol=1e-14, rtol=0), (
        "expected the gradient summed over the vocabulary to be 2 log Z / n at each position, "
        f"off by up to {float((grad.sum(-1) - want).abs().max()):.3g}")
    c = solutions.logit_shift_for_zero_z(logits)
    assert c.shape == (3, 5), f"expected one shift per position, shape (3, 5), got {tuple(c.shape)}"
    shifted = logits + c[..., None]
    after = float(z_loss(shifted))
    assert after < 1e-28, f"expected z_loss of the shifted logits below 1e-28, got {after:.3g}"
    change = abs(float(cross_entropy(shifted, targets) - cross_entropy(logits, targets)))
    assert change < 1e-13, f"expected the shift to leave the cross-entropy unchanged, it moved {change:.3g}"
    before = float(z_loss(logits))
    assert before > 1.0, f"expected these logits' z_loss above 1 (else the test is weak), got {before}"
    with raises(TypeError, match="logits", what="z_loss_gradient of an integer tensor"):
        solutions.z_loss_gradient(torch.tensor([1, 2]))
    with raises(ValueError, match="empty", what="logit_shift_for_zero_z of an empty (2, 0) tensor"):
        solutions.logit_shift_for_zero_z(torch.zeros(2, 0))
