"""Tests for llmbook.training.batch_size: accumulation, the noise scale and its estimators, the trade-off fit, the chapter's experiment."""

import copy
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from llmbook.paths import data_path
from llmbook.text.data import default_source
from llmbook.training.batch_size import (
    BatchSizeExperiment,
    ExperimentData,
    NoiseEstimate,
    TradeoffFit,
    accumulate_gradients,
    accumulated_train_step,
    fit_steps_examples_tradeoff,
    global_batch_size,
    linear_regression_gradient_moments,
    microbatch_noise_estimate,
    noise_scale,
    steps_to_target,
    unbiased_noise_estimates,
)
from llmbook.training.optim import AdamW, cosine_schedule
from llmbook.training.train import get_batch, param_groups, train_step
from llmbook.transformer.model import TransformerConfig, TransformerLM

pytestmark = pytest.mark.usefixtures("one_thread")

V, T, PAD = 16, 7, -100


def tiny_model(seed=0):
    cfg = TransformerConfig.gpt2_style(vocab_size=V, d_model=24, n_layers=1, n_heads=2,
                                       max_seq_len=T)
    return TransformerLM(cfg, generator=torch.Generator().manual_seed(seed)).double()


class BiasModel(nn.Module):
    """logits = b for every position: the gradient is p - onehot(y), averaged as weighted."""

    def __init__(self, vocab_size):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(vocab_size, dtype=torch.float64))

    def forward(self, x):
        return self.b.expand(*x.shape, -1)  # (B, T, V)


def padded_micro_batches(seed=0):
    """Three micro-batches of 3, 1 and 2 sequences with 21 - 9, 7 - 1 and 14 - 10 targets."""
    g = torch.Generator().manual_seed(seed)
    tokens = default_source().sample(2_000, seed=seed)
    out = []
    for b, pad in ((3, 3), (1, 1), (2, 5)):
        x, y = get_batch(tokens, b, T, generator=g)
        y = y.clone()
        y[:, T - pad:] = PAD  # right padding: the last `pad` positions of every sequence
        out.append((x, y))
    return out


def full_batch_gradient(model, micro_batches):
    """The peer: one batch, padded to a common shape, PyTorch's own masked cross-entropy."""
    x = torch.cat([m[0] for m in micro_batches])
    y = torch.cat([m[1] for m in micro_batches])
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1), ignore_index=PAD)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def max_diff(a, b):
    return max(float((p - q).abs().max()) for p, q in zip(a, b, strict=True))


# ---------------------------------------------------------------- accumulation


def test_token_weighting_equals_the_big_batch_with_padding():
    model, micro = tiny_model(), padded_micro_batches()
    loss_full, g_full = full_batch_gradient(model, micro)
    loss = accumulate_gradients(model, micro, "tokens")
    assert abs(float(loss) - float(loss_full)) < 1e-13
    assert max_diff(grads(model), g_full) < 1e-13


def test_naive_weighting_is_wrong_with_padding_and_right_without():
    model, micro = tiny_model(), padded_micro_batches()
    _, g_full = full_batch_gradient(model, micro)
    accumulate_gradients(model, micro, "naive")
    scale = max(float(g.abs().max()) for g in g_full)
    assert max_diff(grads(model), g_full) > 1e-3 * scale  # a real difference, not round-off
    # equal token counts: the two weightings agree
    unpadded = [(x, torch.where(y == PAD, x, y)) for x, y in micro[:1]] * 2
    accumulate_gradients(model, unpadded, "naive")
    naive = grads(model)
    accumulate_gradients(model, unpadded, "tokens")
    assert max_diff(grads(model), naive) < 1e-15


def test_worked_example_bias_model_exact_gradients():
    # micro-batch 1: targets [0, pad]; micro-batch 2: targets [1, 1, 2, pad]; at b = 0, p = 1/4
    model = BiasModel(4)
    x1, x2 = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long)
    micro = [(x1, torch.tensor([[0, PAD]])), (x2, torch.tensor([[1, 1, 2, PAD]]))]
    loss = accumulate_gradients(model, micro, "tokens")
    assert abs(float(loss) - math.log(4)) < 1e-15
    # token weighting: p - (1, 2, 1, 0)/4
    assert torch.allclose(model.b.grad, torch.tensor([0.0, -0.25, 0.0, 0.25], dtype=torch.float64),
                          atol=1e-16, rtol=0)
    accumulate_gradients(model, micro, "naive")
    # naive: p - ((1, 0, 0, 0)/1 + (0, 2, 1, 0)/3)/2 = (1/4 - 1/2, 1/4 - 1/3, 1/4 - 1/6, 1/4)
    expected = torch.tensor([-0.25, 0.25 - 1 / 3, 0.25 - 1 / 6, 0.25], dtype=torch.float64)
    assert torch.allclose(model.b.grad, expected, atol=1e-16, rtol=0)


def test_accumulated_gradient_against_finite_differences():
    model = BiasModel(5)
    with torch.no_grad():
        model.b.copy_(torch.tensor([0.3, -1.2, 0.7, 0.0, 2.1], dtype=torch.float64))
    micro = [(torch.zeros(2, 3, dtype=torch.long), torch.tensor([[0, 4, PAD], [1, PAD, PAD]])),
             (torch.zeros(1, 3, dtype=torch.long), torch.tensor([[2, 2, 3]]))]
    accumulate_gradients(model, micro, "tokens")
    analytic = model.b.grad.clone()

    def objective():
        with torch.no_grad():
            return float(accumulate_gradients_value(model, micro))

    h = 1e-6
    for i in range(5):
        with torch.no_grad():
            model.b[i] += h
        up = objective()
        with torch.no_grad():
            model.b[i] -= 2 * h
        down = objective()
        with torch.no_grad():
            model.b[i] += h
        assert abs((up - down) / (2 * h) - float(analytic[i])) < 1e-8


def accumulate_gradients_value(model, micro):
    y = torch.cat([t.reshape(-1) for _, t in micro])
    logits = torch.cat([model(x).reshape(-1, model.b.numel()) for x, _ in micro])
    return F.cross_entropy(logits, y, ignore_index=PAD)


def test_accumulated_train_step_equals_train_step():
    a = tiny_model(1)
    b = copy.deepcopy(a)
    opt_a, opt_b = AdamW(param_groups(a, 0.1), lr=1e-2), AdamW(param_groups(b, 0.1), lr=1e-2)
    tokens = default_source().sample(3_000, seed=2)
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        x, y = get_batch(tokens, 6, T, generator=g)
        loss_a, norm_a = train_step(a, opt_a, x, y, 1e-2, grad_clip=0.5)
        micro = [(x[:1], y[:1]), (x[1:4], y[1:4]), (x[4:], y[4:])]  # uneven: 1, 3, 2 sequences
        loss_b, norm_b = accumulated_train_step(b, opt_b, micro, 1e-2, grad_clip=0.5)
        assert abs(float(loss_a) - float(loss_b)) < 1e-13
        assert abs(float(norm_a) - float(norm_b)) < 1e-12
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-12, rtol=0)


def test_accumulation_bad_input():
    model = tiny_model()
    x = torch.zeros(2, T, dtype=torch.long)
    with pytest.raises(ValueError, match="weighting must be one of"):
        accumulate_gradients(model, [(x, x)], "mean")
    with pytest.raises(ValueError, match="at least one"):
        accumulate_gradients(model, [])
    with pytest.raises(TypeError, match="micro_batches must be a sequence"):
        accumulate_gradients(model, x)
    with pytest.raises(ValueError, match=r"micro_batches\[0\]: x and y must both be"):
        accumulate_gradients(model, [(x, x[:, :3])])
    with pytest.raises(ValueError, match="every micro-batch needs a counted target"):
        accumulate_gradients(model, [(x, x), (x, torch.full_like(x, PAD))])
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        accumulate_gradients("model", [(x, x)])
    with pytest.raises(TypeError, match="optimizer must be"):
        accumulated_train_step(model, "adam", [(x, x)], 1e-3)


# ---------------------------------------------------------------- global batch size


def test_global_batch_size_counts_only_data_parallel_replicas():
    assert global_batch_size(4, 8, 1) == 32
    assert global_batch_size(4, 8, 64) == 2048
    # 64 GPUs as tp 8 x pp 2 x dp 4: only the 4 replicas see different data
    assert global_batch_size(4, 8, 64, tensor_parallel=8, pipeline_parallel=2) == 128
    with pytest.raises(ValueError, match="not a multiple of tensor_parallel x pipeline_parallel"):
        global_batch_size(1, 1, 12, tensor_parallel=8)
    with pytest.raises(ValueError, match="accumulation_steps must be positive"):
        global_batch_size(1, 0, 8)
    with pytest.raises(TypeError, match="world_size must be an int"):
        global_batch_size(1, 1, 8.0)


@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_global_batch_size_property(micro, accum, dp, tp, pp):
    assert global_batch_size(micro, accum, dp * tp * pp, tp, pp) == micro * accum * dp


# ---------------------------------------------------------------- noise scale


def test_noise_scale_worked_example():
    G = np.array([3.0, 4.0])
    Sigma = np.array([[1.0, 0.5], [0.5, 2.0]])
    assert noise_scale(G, Sigma) == pytest.approx(3 / 25, abs=1e-16)
    H = np.diag([2.0, 1.0])  # tr(H Sigma) = 2 + 2 = 4, G^T H G = 18 + 16 = 34
    assert noise_scale(G, Sigma, H) == pytest.approx(4 / 34, abs=1e-16)


@given(st.integers(2, 6), st.integers(1, 3), st.floats(0.1, 10.0), st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_noise_scale_with_isotropic_hessian_is_b_simple(p, extra, h, seed):
    rng = np.random.default_rng(seed)
    G = rng.standard_normal(p)
    A = rng.standard_normal((p, p + extra))  # non-square factor: Sigma = A A^T
    Sigma = A @ A.T
    assert noise_scale(G, Sigma, h * np.eye(p)) == pytest.approx(noise_scale(G, Sigma), rel=1e-12)


def test_noise_scale_bad_input():
    with pytest.raises(ValueError, match=r"Sigma must be \(2, 2\)"):
        noise_scale(np.ones(2), np.eye(3))
    with pytest.raises(ValueError, match="H must be"):
        noise_scale(np.ones(2), np.eye(2), np.eye(3))
    with pytest.raises(ValueError, match="G must be 1-D"):
        noise_scale(np.ones((2, 1)), np.eye(2))
    with pytest.raises(ValueError, match="G\\^T H G > 0"):
        noise_scale(np.zeros(2), np.eye(2))
    with pytest.raises(TypeError, match="G must be a sequence of numbers"):
        noise_scale("G", np.eye(2))


@given(st.floats(0.0, 100.0), st.floats(0.0, 1000.0), st.integers(1, 64), st.integers(1, 64))
@settings(max_examples=60, deadline=None)
def test_estimators_recover_exact_expectations(g_sq, trace, b_small, extra):
    b_big = b_small + extra
    small, big = g_sq + trace / b_small, g_sq + trace / b_big
    est_g, est_t = unbiased_noise_estimates(small, big, b_small, b_big)
    assert est_g == pytest.approx(g_sq, abs=1e-9 * (1 + trace))
    assert est_t == pytest.approx(trace, abs=1e-9 * (1 + trace) * b_big)


def test_unbiased_estimates_worked_example():
    # |G|^2 = 2, tr Sigma = 8: E|G_2|^2 = 6, E|G_8|^2 = 3
    assert unbiased_noise_estimates(6.0, 3.0, 2, 8) == (2.0, 8.0)
    with pytest.raises(ValueError, match="b_big must exceed b_small"):
        unbiased_noise_estimates(6.0, 3.0, 8, 8)
    with pytest.raises(ValueError, match="norm_sq_big must be a finite number >= 0"):
        unbiased_noise_estimates(6.0, -1.0, 2, 8)


def test_microbatch_estimate_is_sample_covariance_exactly():
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((5, 9)) + 0.7  # K = 5 micro-batches, P = 9 parameters
    est = microbatch_noise_estimate(rows, micro_batch_size=4)
    assert est.trace_sigma == pytest.approx(4 * np.trace(np.cov(rows.T)), rel=1e-13)
    mean = rows.mean(0)
    assert est.grad_sq == pytest.approx(mean @ mean - est.trace_sigma / 20, rel=1e-13)
    assert est.b_simple == pytest.approx(est.trace_sigma / est.grad_sq, rel=1e-15)
    assert isinstance(est, NoiseEstimate)
    with pytest.raises(ValueError, match="at least 2 micro-batch gradients"):
        microbatch_noise_estimate(rows[:1], 4)
    with pytest.raises(ValueError, match="grads must be finite"):
        microbatch_noise_estimate(np.full((2, 3), np.nan), 4)


def test_linear_regression_moments_against_monte_carlo():
    rng = np.random.default_rng(0)
    w_star, w = np.array([1.0, -2.0, 0.5]), np.array([0.2, 0.3, -0.4])
    G, Sigma = linear_regression_gradient_moments(w, w_star, 0.8)
    n = 400_000
    x = rng.standard_normal((n, 3))
    y = x @ w_star + 0.8 * rng.standard_normal(n)
    per_example = x * (x @ w - y)[:, None]  # (n, P)
    se = per_example.std(0) / math.sqrt(n)
    assert np.all(np.abs(per_example.mean(0) - G) < 5 * se)
    assert np.allclose(np.cov(per_example.T), Sigma, rtol=0.03, atol=0.03)
    d = w - w_star
    assert np.trace(Sigma) == pytest.approx(4 * (d @ d) + 3 * 0.8**2, rel=1e-14)
    with pytest.raises(ValueError, match="same shape"):
        linear_regression_gradient_moments(w, w_star[:2], 0.8)
    with pytest.raises(ValueError, match="noise_std must be"):
        linear_regression_gradient_moments(w, w_star, -1.0)


def test_estimators_recover_the_regression_noise_scale():
    rng = np.random.default_rng(1)
    w_star, w = rng.standard_normal(6), rng.standard_normal(6)
    G, Sigma = linear_regression_gradient_moments(w, w_star, 0.5)
    b, k, reps = 8, 4, 2_000
    g_sq, traces = [], []
    for _ in range(reps):
        x = rng.standard_normal((k * b, 6))
        y = x @ w_star + 0.5 * rng.standard_normal(k * b)
        per_example = x * (x @ w - y)[:, None]
        est = microbatch_noise_estimate(per_example.reshape(k, b, 6).mean(1), b)
        g_sq.append(est.grad_sq)
        traces.append(est.trace_sigma)
    g_sq, traces = np.array(g_sq), np.array(traces)
    # unbiased: each mean within 4 standard errors of the truth
    assert abs(g_sq.mean() - G @ G) < 4 * g_sq.std() / math.sqrt(reps)
    assert abs(traces.mean() - np.trace(Sigma)) < 4 * traces.std() / math.sqrt(reps)
    ratio = traces.mean() / g_sq.mean()
    assert ratio == pytest.approx(noise_scale(G, Sigma), rel=0.1)


# ---------------------------------------------------------------- steps and examples


def test_steps_to_target_worked_examples():
    steps, losses = [10, 20, 40, 80], [3.0, 2.0, 1.5, 1.0]
    assert steps_to_target(steps, losses, 3.5) == 10.0
    assert steps_to_target(steps, losses, 2.0) == 20.0
    # halfway between 2.0 and 1.5 in loss is halfway between 20 and 40 in log(step)
    assert steps_to_target(steps, losses, 1.75) == pytest.approx(20 * math.sqrt(2), rel=1e-15)
    assert steps_to_target(steps, losses, 0.5) == math.inf
    assert steps_to_target([0, 10], [4.0, 2.0], 3.0) == pytest.approx(5.0, rel=1e-15)
    with pytest.raises(ValueError, match="strictly increasing"):
        steps_to_target([10, 10], [1.0, 0.5], 0.7)
    with pytest.raises(ValueError, match="one shape"):
        steps_to_target([10, 20], [1.0], 0.7)
    with pytest.raises(ValueError, match="target must be a finite number"):
        steps_to_target([10, 20], [1.0, 0.5], float("nan"))


def test_tradeoff_fit_recovers_exact_curve():
    b = np.array([8.0, 16, 32, 64, 128, 512])
    s = 150.0 + 24_000.0 / b  # S_min = 150, E_min = 24000, B_crit = 160
    fit = fit_steps_examples_tradeoff(b, s)
    assert fit.s_min == pytest.approx(150.0, rel=1e-12)
    assert fit.e_min == pytest.approx(24_000.0, rel=1e-12)
    assert fit.b_crit == pytest.approx(160.0, rel=1e-12)
    assert fit.relative_rms < 1e-12
    e = b * s
    assert np.allclose((s / fit.s_min - 1) * (e / fit.e_min - 1), 1.0, rtol=1e-10)
    assert np.allclose(fit.examples(b), e, rtol=1e-12)
    assert isinstance(fit, TradeoffFit)


@given(st.floats(10.0, 1e4), st.floats(10.0, 1e6), st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_tradeoff_fit_is_unbiased_under_symmetric_noise(s_min, e_min, seed):
    rng = np.random.default_rng(seed)
    b = np.geomspace(2, 4096, 12)
    s = (s_min + e_min / b) * np.exp(0.01 * rng.standard_normal(12))
    fit = fit_steps_examples_tradeoff(b, s)
    assert fit.relative_rms < 0.05
    assert np.allclose(fit.steps(b), s_min + e_min / b, rtol=0.05)


def test_tradeoff_fit_bad_input():
    with pytest.raises(ValueError, match="two distinct batch sizes"):
        fit_steps_examples_tradeoff([8, 8], [100, 110])
    with pytest.raises(ValueError, match="steps must be finite"):
        fit_steps_examples_tradeoff([8, 16], [100, math.inf])
    with pytest.raises(ValueError, match="must be positive"):
        fit_steps_examples_tradeoff([8, 16], [100, 0])
    with pytest.raises(ValueError, match="one shape"):
        fit_steps_examples_tradeoff([8, 16, 32], [100, 50])


# ---------------------------------------------------------------- the chapter's experiment

SMALL = dict(num_train_tokens=20_000, num_val_tokens=2_000, val_windows=64, d_model=16,
             n_heads=2, eval_points=8, noise_micro_batch=4, noise_micro_batches=4)


@pytest.fixture(scope="module")
def small():
    exp = BatchSizeExperiment(**SMALL)
    return exp, exp.experiment_data()


def test_experiment_defaults_are_the_shipped_runs():
    runs = json.loads(data_path("batch_size", "runs.json").read_text())
    exp = BatchSizeExperiment()
    assert exp.source_spec() == runs["source"]
    assert exp.model_config().to_dict() == runs["model"]
    assert (exp.context, exp.lr, exp.warmup_steps, list(exp.betas), exp.grad_clip,
            exp.target_excess) == (runs["context_length"], runs["lr"], runs["warmup_steps"],
                                   runs["betas"], runs["grad_clip"], runs["target_excess"])
    assert (exp.noise_micro_batch, exp.noise_micro_batches) == \
        (runs["noise"]["micro_batch"], runs["noise"]["micro_batches"])
    data = exp.experiment_data()
    assert data.entropy_rate == runs["entropy_rate"]
    assert exp.target(data) == runs["target"]


def test_experiment_data_shapes_and_windows(small):
    exp, data = small
    assert isinstance(data, ExperimentData)
    assert data.tokens.shape == (20_000,)
    assert data.x_val.shape == data.y_val.shape == (64, exp.context)
    assert torch.equal(data.x_val[:, 1:], data.y_val[:, :-1])  # targets are the next tokens
    assert 0 < data.entropy_rate < math.log(exp.vocab_size)
    again = exp.experiment_data()
    assert torch.equal(again.tokens, data.tokens) and torch.equal(again.x_val, data.x_val)


def test_warmup_constant_worked_example():
    exp = BatchSizeExperiment()  # lr 1e-2 after 10 warmup steps
    assert [exp.warmup_constant(s) for s in (0, 4, 9, 10, 1000)] == \
        pytest.approx([1e-3, 5e-3, 1e-2, 1e-2, 1e-2], rel=1e-15)
    assert BatchSizeExperiment(warmup_steps=0).warmup_constant(0) == 1e-2


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 50), st.integers(0, 200))
def test_warmup_constant_rises_to_lr_and_stays(warmup, step):
    exp = BatchSizeExperiment(warmup_steps=warmup, lr=3e-3)
    lr, nxt = exp.warmup_constant(step), exp.warmup_constant(step + 1)
    assert 0 < lr <= nxt <= 3e-3
    if step + 1 >= warmup:
        assert lr == 3e-3


def test_cosine_recipe_is_the_cosine_schedule():
    exp = BatchSizeExperiment(lr=2e-3)
    sched = exp.cosine_recipe(30, 0.1, 300)
    for s in (0, 15, 30, 100, 299, 300, 400):
        assert sched(s) == cosine_schedule(s, 2e-3, 2e-4, 30, 300)
    assert sched(300) == pytest.approx(2e-4, rel=1e-12)
    assert exp.cosine_recipe(0, 1.0, 50)(17) == pytest.approx(2e-3, rel=1e-12)


def test_eval_steps_is_a_geometric_grid_ending_at_steps():
    exp = BatchSizeExperiment(eval_points=5)
    assert exp.eval_steps(16) == [1, 2, 4, 8, 16]
    grid = BatchSizeExperiment().eval_steps(1500)
    assert grid[0] == 1 and grid[-1] == 1500 and len(grid) <= 41
    assert all(a < b for a, b in zip(grid, grid[1:], strict=False))


def test_train_run_is_deterministic_and_stop_at_stops(small):
    exp, data = small
    a = exp.train_run(data, 8, 20)
    b = exp.train_run(data, 8, 20)
    assert a == b
    assert a["steps"] == exp.eval_steps(20) and len(a["train_loss"]) == 20 and a["noise"] == []
    assert a["val_loss"][-1] < a["val_loss"][0]  # it learns
    stopped = exp.train_run(data, 8, 20, stop_at=a["val_loss"][2])
    assert stopped["steps"] == a["steps"][:3]
    assert stopped["val_loss"] == a["val_loss"][:3]
    assert stopped["train_loss"] == a["train_loss"][:a["steps"][2]]
    assert exp.train_run(data, 8, 20, stop_at=100.0)["steps"] == [1]
    other = exp.train_run(data, 16, 20)  # a different batch: a different run
    assert other["train_loss"] != a["train_loss"]


def test_train_run_with_zero_learning_rate_does_not_move(small):
    exp, data = small
    r = exp.train_run(data, 4, 10, lr_at=lambda step: 0.0)
    assert len(set(r["val_loss"])) == 1  # AdamW with lr 0 and no decay leaves the weights


def test_train_run_against_torch_adamw(small):
    """The peer: the same loop with torch.optim.AdamW and torch's clip_grad_norm_."""
    exp, data = small
    exp = BatchSizeExperiment(**{**SMALL, "betas": (0.8, 0.99), "grad_clip": 0.5})
    r = exp.train_run(data, 8, 12, betas=(0.85, 0.95))
    model = exp.make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=exp.lr, betas=(0.85, 0.95), eps=1e-8,
                            weight_decay=0.0)
    batches = torch.Generator().manual_seed(exp.batch_seed)
    losses = []
    for step in range(12):
        x, y = get_batch(data.tokens, 8, exp.context, generator=batches)
        for group in opt.param_groups:
            group["lr"] = exp.warmup_constant(step)
        loss = F.cross_entropy(model(x).reshape(-1, exp.vocab_size), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(float(loss.detach()))
    np.testing.assert_allclose(r["train_loss"], losses, atol=2e-5)
    with torch.no_grad():
        val = float(F.cross_entropy(model(data.x_val).reshape(-1, exp.vocab_size),
                                    data.y_val.reshape(-1)))
    assert r["val_loss"][-1] == pytest.approx(val, abs=1e-4)


def test_noise_point_and_noisy_run(small):
    exp, data = small
    model = exp.make_model()
    before = [p.detach().clone() for p in model.parameters()]
    est = exp.noise_point(model, data.tokens, torch.Generator().manual_seed(0))
    assert isinstance(est, NoiseEstimate)
    assert math.isfinite(est.grad_sq) and est.grad_sq > 0
    assert math.isfinite(est.trace_sigma) and est.trace_sigma > 0
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    again = exp.noise_point(model, data.tokens, torch.Generator().manual_seed(0))
    assert again == est
    r = exp.train_run(data, 8, 10, noise=True)
    assert len(r["noise"]) == len(r["steps"])
    assert all(p["grad_sq"] > 0 and p["trace_sigma"] > 0 for p in r["noise"])


def test_experiment_bad_input(small):
    exp, data = small
    for kwargs, err, name in (({"n_heads": 3}, ValueError, "n_heads"),
                              ({"lr": -1.0}, ValueError, "lr"),
                              ({"d_model": 16.0}, TypeError, "d_model"),
                              ({"betas": (0.9, 1.0)}, ValueError, "betas"),
                              ({"betas": 0.9}, TypeError, "betas"),
                              ({"noise_micro_batches": 1}, ValueError, "noise_micro_batches"),
                              ({"warmup_steps": -1}, ValueError, "warmup_steps"),
                              ({"num_val_tokens": 8}, ValueError, "num_val_tokens")):
        with pytest.raises(err, match=name):
            BatchSizeExperiment(**{**SMALL, **kwargs})
    with pytest.raises(TypeError, match="data"):
        exp.train_run((data.tokens, data.x_val), 8, 5)
    with pytest.raises(ValueError, match="batch_size"):
        exp.train_run(data, 0, 5)
    with pytest.raises(TypeError, match="steps"):
        exp.train_run(data, 8, 5.0)
    with pytest.raises(TypeError, match="lr_at"):
        exp.train_run(data, 8, 5, lr_at=1e-3)
    with pytest.raises(ValueError, match="stop_at"):
        exp.train_run(data, 8, 5, stop_at=float("nan"))
    with pytest.raises(TypeError, match="noise"):
        exp.train_run(data, 8, 5, noise="yes")
    with pytest.raises(ValueError, match="step"):
        exp.warmup_constant(-1)
    with pytest.raises(ValueError, match="warmup_steps"):
        exp.cosine_recipe(40, 0.1, 30)
    with pytest.raises(TypeError, match="model"):
        exp.noise_point("model", data.tokens, torch.Generator())
    with pytest.raises(TypeError, match="generator"):
        exp.noise_point(exp.make_model(), data.tokens, 0)
    with pytest.raises(TypeError, match="data"):
        exp.target(1.0)
