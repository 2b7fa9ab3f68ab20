"""Tests for llmbook.training.mtp: multi-token models, their loss, gradient and exact floors."""

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.data import MarkovSource, default_source
from llmbook.text.functional import cross_entropy
from llmbook.training.mtp import (
    ParallelMTP,
    SequentialMTP,
    deepseek_weights,
    evaluate_heads,
    future_token_table,
    get_mtp_batch,
    head_entropy_floors,
    mtp_gradient_symbolic,
    multi_token_loss,
    train_mtp,
)
from llmbook.training.train import TrainConfig, evaluate, train
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

V, D, T = 11, 24, 7


def config(style="gpt2", **kw):
    make = TransformerConfig.gpt2_style if style == "gpt2" else TransformerConfig.llama_style
    return make(vocab_size=V, d_model=D, n_layers=2, n_heads=3, max_seq_len=12, **kw)


def ids(B=2, L=T, seed=0):
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_shapes_non_square(style):
    par = ParallelMTP(config(style), 3, generator=torch.Generator().manual_seed(0))
    assert par(ids()).shape == (3, 2, T, V)
    seq = SequentialMTP(config(style), 2, generator=torch.Generator().manual_seed(0))
    assert seq(ids(L=T + 2)).shape == (3, 2, T, V)
    assert par.input_length(T) == T and seq.input_length(T) == T + 2


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_head_one_is_the_next_token_model(style):
    model = ParallelMTP(config(style), 3, generator=torch.Generator().manual_seed(1)).double()
    x = ids()
    assert torch.allclose(model(x)[0], model.lm(x), atol=1e-12, rtol=0)
    seq = SequentialMTP(config(style), 2, generator=torch.Generator().manual_seed(1)).double()
    xs = ids(L=T + 2)
    assert torch.allclose(seq(xs)[0], seq.lm(xs[:, :T]), atol=1e-12, rtol=0)


def test_n1_equals_plain_next_token_model_exactly():
    cfg = config()
    mtp = ParallelMTP(cfg, 1, generator=torch.Generator().manual_seed(3))
    plain = TransformerLM(cfg, generator=torch.Generator().manual_seed(3))
    for a, b in zip(mtp.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)  # same initialisation, parameter for parameter
    x, targets = get_mtp_batch(default_source().sample(500, seed=1) % V, 4, T, 1,
                               torch.Generator().manual_seed(0))
    loss, per_head = multi_token_loss(mtp(x), targets)
    assert torch.equal(loss, cross_entropy(plain(x), targets[0]))
    assert per_head.shape == (1,)


def test_sequential_with_lambda_zero_is_the_main_loss():
    seq = SequentialMTP(config(), 1, generator=torch.Generator().manual_seed(2))
    tokens = default_source().sample(500, seed=2) % V
    x, targets = get_mtp_batch(tokens, 3, T, 2, torch.Generator().manual_seed(0))
    loss, per_head = multi_token_loss(seq(x), targets, deepseek_weights(1, 0.0))
    assert torch.equal(loss, cross_entropy(seq.lm(x[:, :T]), targets[0]))
    loss3, _ = multi_token_loss(seq(x), targets, deepseek_weights(1, 0.3))
    assert torch.isclose(loss3, per_head[0] + 0.3 * per_head[1])


def test_loss_equals_hand_computed_loop():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 2, 5, V, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (3, 2, 5), generator=g)
    w = [1.0, 0.5, 0.25]
    total, per_head = multi_token_loss(logits, targets, w)
    expected, heads = 0.0, []
    for k in range(3):
        s = 0.0
        for b in range(2):
            for t in range(5):
                z = logits[k, b, t]
                s += float(torch.logsumexp(z, 0) - z[targets[k, b, t]])
        heads.append(s / 10)
        expected += w[k] * s / 10
    assert abs(float(total) - expected) < 1e-12
    assert torch.allclose(per_head, torch.tensor(heads, dtype=torch.float64), atol=1e-12)


def test_mtp_batch_targets_are_the_shifted_window():
    tokens = torch.arange(1000) % V
    x, targets = get_mtp_batch(tokens, 4, T, 3, torch.Generator().manual_seed(0))
    assert x.shape == (4, T + 2) and targets.shape == (3, 4, T)
    for k in range(1, 4):
        for t in range(T):
            if t + k < x.shape[1]:
                assert torch.equal(targets[k - 1, :, t], x[:, t + k])
    # the same window and generator: the same windows whatever n
    _, t1 = get_mtp_batch(tokens, 4, T, 1, torch.Generator().manual_seed(5), window=T + 3)
    _, t4 = get_mtp_batch(tokens, 4, T, 4, torch.Generator().manual_seed(5), window=T + 3)
    assert torch.equal(t1[0], t4[0])


def test_gradient_float64_gradcheck_and_trunk_gets_the_sum():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 5, (2, 2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda z: multi_token_loss(z, targets, [1.0, 0.7])[0], (logits,))
    # closed form: dL/dz_k = w_k (softmax(z_k) - onehot) / (B T)
    total, _ = multi_token_loss(logits, targets, [1.0, 0.7])
    (grad,) = torch.autograd.grad(total, logits)
    onehot = torch.nn.functional.one_hot(targets, 5).double()
    w = torch.tensor([1.0, 0.7], dtype=torch.float64)[:, None, None, None]
    assert torch.allclose(grad, w * (logits.softmax(-1) - onehot) / 6, atol=1e-14)
    # through a model: the trunk's gradient is the sum of the heads' gradients
    model = ParallelMTP(config(), 3, generator=torch.Generator().manual_seed(4)).double()
    x, tg = get_mtp_batch(torch.arange(500) % V, 2, T, 3, torch.Generator().manual_seed(0))
    z, positions = model.trunk(x[:, :T])
    heads = [model.lm.blocks[-1], *model.extra_heads]
    per = [cross_entropy(model.lm.final_norm(h(z, positions, None)) @ model.lm.embed.weight.T, tg[k])
           for k, h in enumerate(heads)]
    (g_total,) = torch.autograd.grad(sum(per), z, retain_graph=True)
    g_sum = sum(torch.autograd.grad(p, z, retain_graph=True)[0] for p in per)
    assert torch.allclose(g_total, g_sum, atol=1e-14)


def test_gradient_symbolic():
    r = mtp_gradient_symbolic(2, 3, 2)
    point = {sym: sp.Rational(i % 7 - 3, 5) for i, sym in enumerate(sorted(r["loss"].free_symbols, key=str))}
    diff = (r["grad_trunk"] - r["grad_trunk_formula"]).subs(point)
    assert max(abs(float(sp.N(v, 30))) for v in diff) < 1e-25
    diff_w = (r["grad_W"] - r["grad_W_formula"]).subs(point)
    assert max(abs(float(sp.N(v, 30))) for v in diff_w) < 1e-25
    grad_z, zs = r["grad_logits"][0]
    soft = sp.Matrix([sp.exp(z) for z in zs]) / sum(sp.exp(z) for z in zs)
    assert sp.simplify(grad_z - (soft - r["onehots"][0])) == sp.zeros(3, 1)
    small = mtp_gradient_symbolic(2, 2, 1)
    assert sp.simplify(small["grad_trunk"] - small["grad_trunk_formula"]) == sp.zeros(1, 1)


@pytest.fixture(scope="module")
def data():
    return default_source().train_val(20_000, 4_000, seed=3)


def test_train_mtp_n1_matches_chapter_10_train(data):
    tr, va = data
    cfg = TransformerConfig.gpt2_style(vocab_size=16, d_model=24, n_layers=2, n_heads=2, max_seq_len=T)
    tc = TrainConfig(steps=6, batch_size=8, context_length=T, lr=1e-2, min_lr=1e-3, warmup_steps=2,
                     eval_every=None, eval_batches=2, seed=0)
    mtp = ParallelMTP(cfg, 1, generator=torch.Generator().manual_seed(0))
    plain = TransformerLM(cfg, generator=torch.Generator().manual_seed(0))
    h1 = train_mtp(mtp, tr, va, tc, window=T)
    h2 = train(plain, tr, None, tc)
    assert max(abs(a - b) for a, b in zip(h1.train_loss, h2.train_loss, strict=True)) < 1e-5
    assert abs(evaluate_heads(mtp, va, 8, T, 3, window=T)[0] - evaluate(plain, va, 8, T, 3)) < 1e-4


def test_train_mtp_learns_and_is_deterministic(data):
    tr, va = data
    cfg = TransformerConfig.gpt2_style(vocab_size=16, d_model=16, n_layers=1, n_heads=2, max_seq_len=T)
    tc = TrainConfig(steps=30, batch_size=16, context_length=T, lr=1e-2, min_lr=1e-3, warmup_steps=3,
                     eval_every=15, eval_batches=2, seed=0)
    runs = [train_mtp(ParallelMTP(cfg, 2, generator=torch.Generator().manual_seed(0)), tr, va, tc)
            for _ in range(2)]
    assert runs[0].train_loss == runs[1].train_loss
    assert runs[0].val_steps == [0, 15, 30]
    assert runs[0].val_head_loss[-1][0] < runs[0].val_head_loss[0][0]
    assert len(runs[0].train_head_loss[0]) == 2


def test_future_token_table_order_one_is_a_matrix_power():
    g = torch.Generator().manual_seed(0)
    P = torch.rand(4, 4, generator=g, dtype=torch.float64)
    P = P / P.sum(1, keepdim=True)
    src = MarkovSource.from_transition(P, order=1)
    for k in (1, 2, 3):
        assert torch.allclose(future_token_table(src, k), torch.linalg.matrix_power(P, k), atol=1e-14)


def test_future_token_table_order_two_by_enumeration():
    src = MarkovSource(vocab_size=3, order=2, seed=1)
    P = src.transition.reshape(3, 3, 3)  # P[a, b, x]
    want = torch.einsum("aby,byx->abx", P, P).reshape(9, 3)
    assert torch.allclose(future_token_table(src, 2), want, atol=1e-14)
    floors = head_entropy_floors(default_source(), 2)
    assert abs(floors[0] - default_source().entropy_rate()) < 1e-12
    # head 2's floor: the entropy of each row of the two-step table (scipy), weighted by the
    # stationary distribution of the context chain (a, b) -> (b, x), found by power iteration
    from scipy.stats import entropy

    M = torch.zeros(9, 9, dtype=torch.float64)
    for a in range(3):
        for b in range(3):
            M[3 * a + b, 3 * b:3 * b + 3] = P[a, b]
    pi = torch.linalg.matrix_power(M, 4096)[0]
    row_entropy = torch.from_numpy(entropy(want.numpy(), axis=1))
    floors = head_entropy_floors(src, 2)
    assert floors[1] == pytest.approx(float((pi * row_entropy).sum()), rel=1e-12)
    assert floors[1] > floors[0] + 1e-3


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 5), st.integers(1, 2), st.integers(0, 10_000))
def test_floors_grow_and_rows_sum_to_one(vocab, order, seed):
    src = MarkovSource(vocab_size=vocab, order=order, concentration=0.5, seed=seed)
    floors = head_entropy_floors(src, 4)
    assert all(b >= a - 1e-10 for a, b in zip(floors, floors[1:], strict=False))
    assert floors[-1] <= torch.log(torch.tensor(float(vocab))).item() + 1e-10
    for k in (1, 3):
        assert torch.allclose(future_token_table(src, k).sum(1), torch.ones(src.num_contexts,
                                                                            dtype=torch.float64))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 5), st.integers(0, 1000))
def test_loss_is_the_weighted_sum_of_heads(n, B, Tl, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, B, Tl, 6, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 6, (n, B, Tl), generator=g)
    w = torch.rand(n, generator=g).tolist()
    total, per_head = multi_token_loss(logits, targets, w)
    assert bool((per_head >= 0).all())
    assert abs(float(total) - sum(a * float(b) for a, b in zip(w, per_head, strict=True))) < 1e-12


def test_bad_input():
    cfg = config()
    with pytest.raises(ValueError, match="n_future"):
        ParallelMTP(cfg, 0)
    with pytest.raises(TypeError, match="config"):
        ParallelMTP("cfg", 2)
    with pytest.raises(ValueError, match="depth"):
        SequentialMTP(cfg, 0)
    with pytest.raises(ValueError, match="ids must have shape"):
        SequentialMTP(cfg, 2)(ids(L=2))
    with pytest.raises(ValueError, match="logits"):
        multi_token_loss(torch.zeros(2, 3, V), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        multi_token_loss(torch.zeros(2, 1, 3, V), torch.zeros(2, 1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="weights"):
        multi_token_loss(torch.zeros(2, 1, 3, V), torch.zeros(2, 1, 3, dtype=torch.long), [1.0])
    with pytest.raises(ValueError, match="lam"):
        deepseek_weights(1, -0.1)
    with pytest.raises(ValueError, match="window"):
        get_mtp_batch(torch.arange(100), 2, 5, 3, window=6)
    with pytest.raises(ValueError, match="k must be positive"):
        future_token_table(default_source(), 0)
    with pytest.raises(TypeError, match="source"):
        head_entropy_floors("source", 2)
    with pytest.raises(ValueError, match="first_position"):
        evaluate_heads(ParallelMTP(cfg, 2), torch.arange(100) % V, 2, 5, 1, first_position=5)
    with pytest.raises(ValueError, match="token id"):
        ParallelMTP(cfg, 2)(torch.full((1, 3), V))
