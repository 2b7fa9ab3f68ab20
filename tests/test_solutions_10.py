"""The exercise solutions of notebooks/10_training hold."""

import copy
import math

import pytest
import sympy as sp
import torch
from solution_loader import load_solutions

from llmbook.text.data import MarkovSource, default_source
from llmbook.text.functional import cross_entropy
from llmbook.training.optim import AdamW
from llmbook.training.pretrained import RECIPES, book_model
from llmbook.training.train import get_batch, param_groups, train_step, z_loss
from llmbook.transformer.model import TransformerConfig, TransformerLM

solutions = load_solutions("10_training")


pytestmark = pytest.mark.usefixtures("one_thread")


def test_tokens_and_epochs():
    assert solutions.tokens_and_epochs(600, 128, 16, 1_000_000) == (1_228_800, 1.2288)
    t = RECIPES["text"]["train"]
    seen, epochs = solutions.tokens_and_epochs(t["steps"], t["batch_size"], t["context_length"],
                                               470_885)
    assert seen == 4_096_000 and 8.6 < epochs < 8.8  # the text model sees its data ~9 times
    with pytest.raises(ValueError, match="num_tokens must be a positive int"):
        solutions.tokens_and_epochs(1, 1, 1, 0)


def test_window_floor_order_two_matches_the_chapter_formula():
    src = default_source()
    H = src.entropy_rate()
    pi = src.stationary.reshape(16, 16)
    H1 = solutions._entropy(pi) - solutions._entropy(pi.sum(1))
    for T in (1, 2, 16, 100):
        assert abs(solutions.window_floor(src, T) - (H1 + (T - 1) * H) / T) < 1e-12
    assert abs(solutions.window_floor(src, 100_000) - H) < 2e-5
    floors = solutions.per_position_floor(src, 5)
    assert floors[0] > floors[1] == floors[4] == pytest.approx(H, abs=1e-15)


def test_window_floor_order_three_and_iid():
    src3 = MarkovSource(vocab_size=3, order=3, concentration=0.5, seed=1)
    floors = solutions.per_position_floor(src3, 4)
    # decreasing conditional entropies, reaching H at t = k - 1 = 2
    assert floors[0] >= floors[1] >= floors[2] - 1e-12
    assert floors[2] == floors[3] == src3.entropy_rate()
    # brute force for position 1: H(X_2 | X_0, X_1) = H(X_0, X_1, X_2) - H(X_0, X_1)
    joint3 = src3.stationary.reshape(3, 3, 3)
    brute = solutions._entropy(joint3) - solutions._entropy(joint3.sum(2))
    assert abs(floors[1] - brute) < 1e-12
    # an i.i.d. "chain" (every row the same) has every floor equal to H
    row = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    iid = MarkovSource.from_transition(row.repeat(9, 1), order=2)
    assert all(abs(f - iid.entropy_rate()) < 1e-12 for f in solutions.per_position_floor(iid, 3))
    assert abs(iid.entropy_rate() - solutions._entropy(row)) < 1e-12


def test_accumulated_step_equals_full_batch_step():
    cfg = TransformerConfig.llama_style(vocab_size=16, d_model=24, n_layers=1, n_heads=2,
                                        max_seq_len=12)
    # float64: Adam divides by sqrt(v), which would magnify float32 round-off in tiny gradients
    a = TransformerLM(cfg, generator=torch.Generator().manual_seed(0)).double()
    b = copy.deepcopy(a)
    opt_a = AdamW(param_groups(a, 0.1), lr=1e-2)
    opt_b = AdamW(param_groups(b, 0.1), lr=1e-2)
    tokens = default_source().sample(4_000, seed=5)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = get_batch(tokens, 12, 12, generator=g)
        full, _ = train_step(a, opt_a, x, y, 1e-2, grad_clip=0.5)
        acc = solutions.accumulated_train_step(b, opt_b, x, y, 1e-2, micro_batches=4, grad_clip=0.5)
        assert abs(full.item() - acc.item()) < 1e-12
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="must divide the batch size B=12"):
        solutions.accumulated_train_step(b, opt_b, x, y, 1e-2, micro_batches=5)


def test_book_model_per_position_losses_respect_their_floors():
    model, _ = book_model("synthetic")
    src = default_source()
    val = src.sample(50_000, seed=77)
    loss = solutions.per_position_loss(model, val, 16, 2_000, torch.Generator().manual_seed(0))
    floors = torch.tensor(solutions.per_position_floor(src, 16), dtype=loss.dtype)
    assert loss.shape == (16,)
    assert abs(loss[0].item() / floors[0].item() - 1) < 0.02
    noise = 3 / math.sqrt(2_000)  # per-token losses have a standard deviation below 1 nat
    assert (loss > floors - noise).all()
    assert abs(solutions.window_floor(src, 16) - floors.mean().item()) < 1e-6
    assert int((loss - floors).argmax()) >= 1  # the excess sits where the full context is used


def test_korthikanti_count_sums_to_the_published_total():
    terms = solutions.korthikanti_activation_bytes()
    s, b, h, a = sp.symbols("s b h a", positive=True, integer=True)
    # Korthikanti et al. (2022), equation 1: s b h (34 + 5 a s / h) bytes per layer
    assert sp.simplify(terms["total"] - s * b * h * (34 + 5 * a * s / h)) == 0
    attention = sum(v for k, v in terms.items() if k.startswith("attention"))
    assert sp.simplify(attention - (11 * s * b * h + 5 * a * s**2 * b)) == 0  # their 11sbh + 5as^2b
    mlp = sum(v for k, v in terms.items() if k.startswith("MLP"))
    assert sp.simplify(mlp - 19 * s * b * h) == 0


def test_book_block_in_16_bit_against_korthikanti():
    book = solutions.book_block_bytes_16bit()
    s, b, h, a = sp.symbols("s b h a", positive=True, integer=True)
    # the book's block: no dropout masks, unfused LayerNorm and GELU save more, attention
    # weights saved twice; at GPT-2 small's shape, per sequence
    shape = {s: 1024, b: 1, h: 768, a: 12}
    ours = int(book.subs(shape))
    theirs = int(solutions.korthikanti_activation_bytes()["total"].subs(shape))
    assert ours == 2 * 1024 * 768 * 32 + 2 * 12 * 1024**2 * 2 + 4 * 1024 + 1024**2 + 12 * 1024
    assert 1.0 < ours / theirs < 1.5


def test_z_loss_gradient_and_zero_shift():
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(3, 5, 7, generator=g, dtype=torch.float64)  # B != T != V
    targets = torch.randint(0, 7, (3, 5), generator=g)
    x = logits.clone().requires_grad_(True)
    z_loss(x).backward()
    grad = solutions.z_loss_gradient(logits)
    assert torch.allclose(grad, x.grad, atol=1e-14, rtol=0)
    # summed over the vocabulary: 2 log Z / n per position (a bias shared by all logits)
    assert torch.allclose(grad.sum(-1), 2 * torch.logsumexp(logits, -1) / 15, atol=1e-14, rtol=0)
    c = solutions.logit_shift_for_zero_z(logits)
    assert c.shape == (3, 5)
    shifted = logits + c[..., None]
    assert float(z_loss(shifted)) < 1e-28
    assert abs(float(cross_entropy(shifted, targets) - cross_entropy(logits, targets))) < 1e-13
    assert float(z_loss(logits)) > 1.0
    with pytest.raises(TypeError, match="logits"):
        solutions.z_loss_gradient(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="empty"):
        solutions.logit_shift_for_zero_z(torch.zeros(2, 0))
