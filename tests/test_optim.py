"""Tests for llmbook.training.optim: SGD, Adam, AdamW, the warmup-cosine schedule and gradient clipping."""

import copy
import io
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from llmbook.text.data import default_source
from llmbook.text.embedding import TokenEmbedding
from llmbook.training.optim import (
    SGD,
    Adam,
    AdamW,
    clip_grad_norm_,
    cosine_schedule,
    gradient_vector,
    set_lr,
    wsd_schedule,
)
from llmbook.transformer.attention import MultiHeadAttention
from llmbook.transformer.layers import MLP, LayerNorm

V, T, D, H, B = 16, 8, 12, 2, 6  # d != T != V, so a transposed axis cannot hide
N_STEPS = 100


class TinyLM(nn.Module):
    """One pre-LN transformer block with tied embeddings: a small but real language model."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = TokenEmbedding(V, D)
        self.pos = nn.Parameter(0.02 * torch.randn(T, D))  # (T, d) learned positions
        self.ln1, self.ln2, self.ln_f = LayerNorm(D), LayerNorm(D), LayerNorm(D)
        self.attn = MultiHeadAttention(D, H, bias=True)
        self.mlp = MLP(D, 3 * D)

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]  # (B, T, d)
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.emb.logits(self.ln_f(x))  # (B, T, V)


def _batches(n=N_STEPS, seed=0):
    tokens = default_source().sample(4000, seed=seed)
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - T - 1, (n, B), generator=g)
    windows = tokens[starts[..., None] + torch.arange(T + 1)]  # (n, B, T + 1)
    return [(w[:, :-1], w[:, 1:]) for w in windows]


pytestmark = pytest.mark.usefixtures("one_thread")


BATCHES = _batches()
torch.manual_seed(0)
BASE = TinyLM()


def _loss(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))


def _train(model, opt, batches, schedule=None, clip=None, clip_fn=None, start=0):
    for i, (x, y) in enumerate(batches, start=start):
        if schedule is not None:
            schedule(opt, i)
        opt.zero_grad()
        _loss(model, x, y).backward()
        if clip is not None:
            clip_fn(model.parameters(), clip)
        opt.step()
    return model


def _max_diff(a, b):
    return max(
        (p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def _groups(model, wd):
    """No weight decay on biases, norm gains and positions; decay on matrices (and E)."""
    decay = [p for p in model.parameters() if p.ndim >= 2 and p is not model.pos]
    ids = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return [
        {"params": decay, "weight_decay": wd},
        {"params": rest, "weight_decay": 0.0, "lr": 5e-3},
    ]


# ---------------------------------------------------------------- against torch.optim

CASES = {
    "SGD": (lambda p: SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "SGD momentum": (
        lambda p: SGD(p, lr=0.05, momentum=0.9),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    ),
    "SGD nesterov + wd": (
        lambda p: SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    ),
    "SGD dampening + wd": (
        lambda p: SGD(p, lr=0.1, momentum=0.8, dampening=0.3, weight_decay=1e-2),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, dampening=0.3, weight_decay=1e-2),
    ),
    "Adam": (lambda p: Adam(p, lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2)),
    "Adam L2": (
        lambda p: Adam(p, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    ),
    "AdamW": (
        lambda p: AdamW(p, lr=1e-2, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    ),
    "AdamW groups": (
        lambda p: AdamW(_groups(p, 0.1), lr=1e-2),
        lambda p: torch.optim.AdamW(_groups(p, 0.1), lr=1e-2),
    ),
    "SGD groups": (
        lambda p: SGD(_groups(p, 1e-2), lr=0.05, momentum=0.9),
        lambda p: torch.optim.SGD(_groups(p, 1e-2), lr=0.05, momentum=0.9),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_follows_torch_optim_for_100_steps_on_a_model(name):
    make_ours, make_ref = CASES[name]
    ours, ref = copy.deepcopy(BASE), copy.deepcopy(BASE)
    grouped = "groups" in name
    _train(ours, make_ours(ours if grouped else ours.parameters()), BATCHES)
    _train(ref, make_ref(ref if grouped else ref.parameters()), BATCHES)
    assert _max_diff(ours, ref) <= 1e-6
    assert _max_diff(ours, BASE) > 1e-3  # and the parameters did move


def test_adam_and_adamw_trajectories_differ_but_sgd_l2_is_decoupled_decay():
    adam, adamw = copy.deepcopy(BASE), copy.deepcopy(BASE)
    _train(adam, Adam(adam.parameters(), lr=1e-2, weight_decay=0.1), BATCHES[:30])
    _train(adamw, AdamW(adamw.parameters(), lr=1e-2, weight_decay=0.1), BATCHES[:30])
    assert _max_diff(adam, adamw) > 1e-3
    # SGD: an L2 penalty lambda is the decoupled decay theta <- (1 - lr lambda) theta
    l2, decoupled = copy.deepcopy(BASE), copy.deepcopy(BASE)
    _train(l2, SGD(l2.parameters(), lr=0.1, weight_decay=0.05), BATCHES[:30])
    opt = SGD(decoupled.parameters(), lr=0.1)
    for x, y in BATCHES[:30]:
        opt.zero_grad()
        _loss(decoupled, x, y).backward()
        with torch.no_grad():
            for p in decoupled.parameters():
                p.mul_(1 - 0.1 * 0.05)
        opt.step()
    assert _max_diff(l2, decoupled) < 1e-6


def _schedule(opt, i):
    set_lr(opt, cosine_schedule(i, 1e-2, 1e-3, 10, N_STEPS))


def test_full_recipe_schedule_clipping_groups_against_torch_and_transformers():
    ours, ref = copy.deepcopy(BASE), copy.deepcopy(BASE)
    _train(
        ours,
        AdamW(_groups(ours, 0.1), lr=1e-2),
        BATCHES,
        schedule=_schedule,
        clip=0.5,
        clip_fn=clip_grad_norm_,
    )
    ref_opt = torch.optim.AdamW(
        [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in _groups(ref, 0.1)],
        lr=1e-2,
    )
    sched = transformers.get_cosine_with_min_lr_schedule_with_warmup(
        ref_opt, 10, N_STEPS, min_lr=1e-3
    )
    for x, y in BATCHES:
        ref_opt.zero_grad()
        _loss(ref, x, y).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
        sched.step()
    assert _max_diff(ours, ref) <= 1e-6


@pytest.mark.parametrize(
    "cls, ref_cls, kw",
    [
        (AdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
        (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ],
)
def test_state_dict_resume_is_exact_and_checkpoints_move_between_implementations(cls, ref_cls, kw):
    straight = copy.deepcopy(BASE)
    _train(straight, cls(straight.parameters(), **kw), BATCHES)
    # stop after 50 steps, save through torch.save, resume in fresh objects
    first = copy.deepcopy(BASE)
    opt = cls(first.parameters(), **kw)
    _train(first, opt, BATCHES[:50])
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optim": opt.state_dict()}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=True)
    resumed = copy.deepcopy(BASE)
    resumed.load_state_dict(ckpt["model"])
    opt2 = cls(resumed.parameters(), **kw)
    opt2.load_state_dict(ckpt["optim"])
    _train(resumed, opt2, BATCHES[50:])
    assert _max_diff(straight, resumed) == 0.0
    # a torch.optim checkpoint resumes in ours, and gives torch's 100-step result
    ref, ref_half = copy.deepcopy(BASE), copy.deepcopy(BASE)
    _train(ref, ref_cls(ref.parameters(), **kw), BATCHES)
    ref_opt = ref_cls(ref_half.parameters(), **kw)
    _train(ref_half, ref_opt, BATCHES[:50])
    ours_opt = cls(ref_half.parameters(), **kw)
    ours_opt.load_state_dict(ref_opt.state_dict())
    _train(ref_half, ours_opt, BATCHES[50:])
    assert _max_diff(ref, ref_half) <= 1e-6


def test_params_without_grad_are_skipped_and_zero_grad_is_inherited():
    w = nn.Parameter(torch.ones(3, 2))
    frozen = nn.Parameter(torch.ones(2))
    for opt in (SGD([w, frozen], lr=0.1, momentum=0.9), Adam([w, frozen]), AdamW([w, frozen])):
        w.grad = torch.full((3, 2), 0.5)
        opt.step()
        assert torch.equal(frozen, torch.ones(2)) and frozen not in opt.state
        assert (w < 1).all()
        opt.zero_grad()
        assert w.grad is None


def test_closure_is_called_and_returned():
    w = nn.Parameter(torch.tensor([2.0, -1.0]))
    opt = SGD([w], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (w**2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == 5.0
    assert torch.equal(w.detach(), torch.tensor([1.0, -0.5]))  # w - 0.25 * 2 w


# ---------------------------------------------------------------- worked examples


def test_sgd_momentum_worked_example():
    w = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = SGD([w], lr=0.1, momentum=0.9)
    expected = [0.8, 0.42, -0.122]  # buffers 2, 3.8, 5.42 for a constant gradient 2
    for want in expected:
        w.grad = torch.tensor([2.0], dtype=torch.float64)
        opt.step()
        assert abs(w.item() - want) < 1e-15
    assert abs(opt.state[w]["momentum_buffer"].item() - 5.42) < 1e-14
    # Nesterov: d = g + mu b
    u = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    nag = SGD([u], lr=0.1, momentum=0.9, nesterov=True)
    u.grad = torch.tensor([2.0], dtype=torch.float64)
    nag.step()  # b = 2, d = 2 + 1.8
    assert abs(u.item() - (1 - 0.38)) < 1e-15


def test_adam_worked_example_first_steps():
    # step 1: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps) ~ lr * sign(g)
    w = nn.Parameter(torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64))
    opt = Adam([w], lr=0.1, eps=0.0)
    w.grad = torch.tensor([4.0, -0.001, 0.0], dtype=torch.float64)
    opt.step()
    assert torch.allclose(
        w.detach()[:2], torch.tensor([0.4, -1.9], dtype=torch.float64), rtol=0, atol=1e-15
    )
    assert torch.isnan(w.detach()[2])  # 0 / 0 with eps = 0: why eps exists
    # step 2 by hand, beta = (0.9, 0.999), eps = 1e-8
    w = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = Adam([w], lr=0.1)
    for g in (1.0, 3.0):
        w.grad = torch.tensor([g], dtype=torch.float64)
        opt.step()
    m = 0.9 * 0.1 * 1.0 + 0.1 * 3.0
    v = 0.999 * 0.001 * 1.0 + 0.001 * 9.0
    step2 = 0.1 * (m / (1 - 0.9**2)) / (math.sqrt(v / (1 - 0.999**2)) + 1e-8)
    assert abs(w.item() - (1.0 - 0.1 * 1 / (1 + 1e-8) - step2)) < 1e-15


def test_adamw_decay_is_lr_lambda_theta_with_zero_gradient():
    # with g = 0 the Adam step is 0 / (0 + eps) = 0 and only the decay acts
    w = nn.Parameter(torch.tensor([1.0, -3.0], dtype=torch.float64))
    opt = AdamW([w], lr=0.1, weight_decay=0.5)
    for _ in range(7):
        w.grad = torch.zeros(2, dtype=torch.float64)
        opt.step()
    assert torch.allclose(
        w.detach(), torch.tensor([1.0, -3.0], dtype=torch.float64) * 0.95**7, rtol=1e-15, atol=0
    )
    # Adam's L2 penalty with zero gradient moves theta by ~lr sign(theta) per step instead
    u = nn.Parameter(torch.tensor([1.0, -3.0], dtype=torch.float64))
    adam = Adam([u], lr=0.1, weight_decay=0.5)
    u.grad = torch.zeros(2, dtype=torch.float64)
    adam.step()
    assert torch.allclose(u.detach(), torch.tensor([0.9, -2.9], dtype=torch.float64), atol=1e-8)


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(1e-3, 1e3), seed=st.integers(0, 10_000))
def test_adam_is_invariant_to_gradient_scale(scale, seed):
    """With eps = 0, multiplying every gradient by c > 0 leaves Adam's trajectory unchanged."""
    g = torch.Generator().manual_seed(seed)
    grads = torch.randn(6, 3, 2, generator=g, dtype=torch.float64)
    a = nn.Parameter(torch.randn(3, 2, generator=g, dtype=torch.float64))
    b = nn.Parameter(a.detach().clone())
    oa, ob = Adam([a], lr=0.01, eps=0.0), Adam([b], lr=0.01, eps=0.0)
    for gr in grads:
        a.grad, b.grad = gr.clone(), scale * gr
        oa.step()
        ob.step()
    assert torch.allclose(a, b, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: SGD(p, lr=-0.1), "lr=-0.1"),
        (lambda p: SGD(p, lr=0.1, momentum=-0.5), "momentum=-0.5"),
        (lambda p: SGD(p, lr=0.1, dampening=1.5), "dampening=1.5"),
        (lambda p: SGD(p, lr=0.1, weight_decay=-1.0), "weight_decay=-1.0"),
        (lambda p: SGD(p, lr=0.1, nesterov=True), "momentum=0.0"),
        (lambda p: SGD(p, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "dampening=0.1"),
        (lambda p: SGD(p, lr=float("nan")), "lr=nan"),
        (lambda p: Adam(p, lr=-1e-3), "lr=-0.001"),
        (lambda p: Adam(p, betas=(1.0, 0.999)), "beta1=1.0"),
        (lambda p: Adam(p, betas=(0.9, -0.1)), "beta2=-0.1"),
        (lambda p: Adam(p, betas=(0.9,)), "betas="),
        (lambda p: Adam(p, eps=-1e-8), "eps=-1e-08"),
        (lambda p: AdamW(p, weight_decay=-0.1), "weight_decay=-0.1"),
        (lambda p: AdamW([{"params": p, "betas": (0.9, 1.5)}]), "beta2=1.5"),
        (lambda p: SGD([{"params": p, "lr": -2.0}], lr=0.1), "lr=-2.0"),
    ],
)
def test_bad_hyperparameters_raise_naming_the_value(make, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        make([nn.Parameter(torch.zeros(2))])


def test_bad_types_raise_type_error():
    with pytest.raises(TypeError, match="lr must be a real number"):
        SGD([nn.Parameter(torch.zeros(2))], lr="0.1")
    with pytest.raises(TypeError, match="optimizer must be"):
        set_lr("adam", 0.1)


# ---------------------------------------------------------------- schedule


def test_cosine_schedule_pinned_values():
    kw = {"max_lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 100, "total_steps": 1100}
    assert cosine_schedule(0, **kw) == 0.0
    assert cosine_schedule(50, **kw) == pytest.approx(3e-4, rel=1e-15)
    assert cosine_schedule(100, **kw) == pytest.approx(6e-4, rel=1e-15)
    assert cosine_schedule(600, **kw) == pytest.approx(3.3e-4, rel=1e-14)  # (max + min) / 2
    assert cosine_schedule(350, **kw) == pytest.approx(
        6e-5 + 5.4e-4 * (1 + math.sqrt(0.5)) / 2, rel=1e-14
    )
    assert cosine_schedule(1100, **kw) == 6e-5
    assert cosine_schedule(5000, **kw) == 6e-5
    assert cosine_schedule(3, 1.0, 0.0, 0, 4) == pytest.approx(0.5 * (1 + math.cos(0.75 * math.pi)))
    assert cosine_schedule(0, 1.0, 0.1, 0, 10) == 1.0  # no warmup
    assert (
        cosine_schedule(9, 1.0, 0.1, 10, 10) == 0.9 and cosine_schedule(10, 1.0, 0.1, 10, 10) == 0.1
    )


def test_cosine_schedule_equals_transformers_and_torch_cosine_annealing():
    max_lr, min_lr, W, N = 3e-3, 2e-4, 7, 53
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=max_lr)
    hf = transformers.get_cosine_with_min_lr_schedule_with_warmup(opt, W, N, min_lr=min_lr)
    for s in range(N + 1):
        assert cosine_schedule(s, max_lr, min_lr, W, N) == pytest.approx(
            hf.get_last_lr()[0], rel=1e-12, abs=1e-18
        )
        opt.step()
        hf.step()
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=max_lr)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=N - W, eta_min=min_lr)
    for s in range(W, N + 1):
        assert cosine_schedule(s, max_lr, min_lr, W, N) == pytest.approx(
            cos.get_last_lr()[0], rel=1e-12
        )
        opt.step()
        cos.step()


@settings(max_examples=80, deadline=None)
@given(
    max_lr=st.floats(1e-6, 10.0),
    frac=st.floats(0.0, 1.0),
    W=st.integers(0, 50),
    extra=st.integers(0, 200),
    step=st.integers(0, 400),
)
def test_cosine_schedule_stays_in_range_and_is_monotone(max_lr, frac, W, extra, step):
    N = W + extra
    min_lr = frac * max_lr
    lr = cosine_schedule(step, max_lr, min_lr, W, N)
    nxt = cosine_schedule(step + 1, max_lr, min_lr, W, N)
    tol = 1e-12 * max_lr
    if step < W:
        assert -tol <= lr <= max_lr + tol and nxt >= lr - tol  # warming up
    else:
        assert min_lr - tol <= lr <= max_lr + tol and nxt <= lr + tol  # decaying


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((0, 1e-3, 0.0, 20, 10), ValueError, "warmup_steps=20 > total_steps=10: a warmup longer"),
        ((0, -1e-3, 0.0, 2, 10), ValueError, "max_lr=-0.001"),
        ((0, 1e-3, -1e-4, 2, 10), ValueError, "min_lr=-0.0001"),
        ((0, 1e-3, 2e-3, 2, 10), ValueError, "min_lr=0.002 must not exceed max_lr=0.001"),
        ((-1, 1e-3, 0.0, 2, 10), ValueError, "step=-1"),
        ((0, 1e-3, 0.0, -2, 10), ValueError, "warmup_steps=-2"),
        ((1.5, 1e-3, 0.0, 2, 10), TypeError, "step must be an int"),
    ],
)
def test_cosine_schedule_bad_inputs(args, exc, match):
    with pytest.raises(exc, match=match):
        cosine_schedule(*args)


def test_set_lr_sets_every_group():
    opt = AdamW(
        [
            {"params": [nn.Parameter(torch.zeros(2))]},
            {"params": [nn.Parameter(torch.zeros(3))], "lr": 1.0},
        ]
    )
    set_lr(opt, 0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]
    with pytest.raises(ValueError, match="lr=-0.5"):
        set_lr(opt, -0.5)


# ---------------------------------------------------------------- clipping


def _grads_pair(shapes, seed, scale=1.0, missing=()):
    g = torch.Generator().manual_seed(seed)
    ours = [nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    for i, p in enumerate(ours):
        if i not in missing:
            p.grad = scale * torch.randn(p.shape, generator=g)
    ref = [nn.Parameter(p.detach().clone()) for p in ours]
    for p, q in zip(ours, ref, strict=True):
        q.grad = None if p.grad is None else p.grad.clone()
    return ours, ref


@pytest.mark.parametrize("scale, max_norm", [(1.0, 0.5), (1.0, 100.0), (1e-3, 1.0)])
def test_clip_grad_norm_equals_torch(scale, max_norm):
    shapes = [(3, 5), (5,), (2, 3, 4), (7,)]
    ours, ref = _grads_pair(shapes, 0, scale, missing=(3,))
    n_ours = clip_grad_norm_(ours, max_norm)
    n_ref = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    assert torch.allclose(n_ours, n_ref, rtol=1e-6, atol=0)
    for p, q in zip(ours, ref, strict=True):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=1e-9)
    # the worked meaning: the returned norm is the norm of all gradients as one vector
    flat = torch.cat(
        [q.grad.reshape(-1) for q in _grads_pair(shapes, 0, scale, (3,))[1] if q.grad is not None]
    )
    assert torch.allclose(n_ours, flat.norm(), rtol=1e-6)


def test_clip_grad_norm_on_the_model_and_edge_cases():
    model = copy.deepcopy(BASE)
    _loss(model, *BATCHES[0]).backward()
    ref = copy.deepcopy(model)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        q.grad = p.grad.clone()
    n_ours = clip_grad_norm_(model.parameters(), 0.1)
    n_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    assert n_ours.item() > 0.1 and torch.allclose(n_ours, n_ref, rtol=1e-6)
    assert (
        max(
            (p.grad - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), ref.parameters(), strict=True)
        )
        < 1e-9
    )
    # a single tensor; no grads at all
    w = nn.Parameter(torch.ones(4))
    w.grad = torch.tensor([3.0, 0.0, 4.0, 0.0])
    assert clip_grad_norm_(w, 1.0).item() == 5.0
    assert torch.allclose(w.grad, torch.tensor([0.6, 0.0, 0.8, 0.0]), atol=1e-6)
    assert clip_grad_norm_([nn.Parameter(torch.ones(2))], 1.0).item() == 0.0


def test_clip_grad_norm_nonfinite_mirrors_torch():
    ours, ref = _grads_pair([(3,), (2,)], 1)
    ours[0].grad[1] = float("nan")
    ref[0].grad[1] = float("nan")
    with pytest.raises(RuntimeError, match="nan"):
        clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    n_ours = clip_grad_norm_(ours, 1.0)
    n_ref = torch.nn.utils.clip_grad_norm_(ref, 1.0)
    assert torch.isnan(n_ours) and torch.isnan(n_ref)
    assert all(
        torch.isnan(p.grad).all() == torch.isnan(q.grad).all()
        for p, q in zip(ours, ref, strict=True)
    )
    with pytest.raises(ValueError, match="max_norm=-1.0"):
        clip_grad_norm_(ours, -1.0)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), log_scale=st.floats(-4, 4), max_norm=st.floats(1e-3, 1e3))
def test_clipping_never_increases_the_norm_and_keeps_the_direction(seed, log_scale, max_norm):
    ours, _ = _grads_pair([(4, 3), (6,)], seed, 10.0**log_scale)
    before = torch.cat([p.grad.reshape(-1) for p in ours]).double()
    norm = clip_grad_norm_(ours, max_norm)
    after = torch.cat([p.grad.reshape(-1) for p in ours]).double()
    assert after.norm() <= min(before.norm(), max_norm * (1 + 1e-6)) * (1 + 1e-6)
    assert torch.allclose(norm.double(), before.norm(), rtol=1e-6)
    cos = (after @ before) / (after.norm() * before.norm())
    assert abs(cos.item() - 1.0) < 1e-6


def test_gradient_vector_joins_grads_in_order_and_skips_frozen():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 5, bias=False))
    model[0].bias.requires_grad_(False)
    x = torch.arange(12.0).reshape(4, 3)
    model(x).pow(2).sum().backward()
    g = gradient_vector(model)
    assert g.shape == (3 * 2 + 2 * 5,)
    assert torch.equal(g, torch.cat([model[0].weight.grad.reshape(-1), model[1].weight.grad.reshape(-1)]))
    assert torch.equal(gradient_vector([model[1].weight]), model[1].weight.grad.reshape(-1))
    # a worked example: d/dw of (w . x)^2 = 2 (w . x) x
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    (w @ torch.tensor([3.0, 0.5])).pow(2).backward()
    assert gradient_vector([w]).tolist() == [12.0, 2.0]


def test_gradient_vector_bad_input():
    with pytest.raises(ValueError, match="no parameter has a gradient"):
        gradient_vector(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="nn.Module or tensors"):
        gradient_vector([1.0, 2.0])


# ---------------------------------------------------------------- warmup-stable-decay


def test_wsd_schedule_boundaries_exact():
    kw = {"max_lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "decay_steps": 20, "total_steps": 100}
    want = {0: 0.0, 5: 5e-4, 10: 1e-3, 50: 1e-3, 79: 1e-3, 80: 1e-3, 90: 5.5e-4, 100: 1e-4, 150: 1e-4}
    for step, lr in want.items():
        assert wsd_schedule(step, **kw) == pytest.approx(lr, rel=1e-15, abs=1e-18), step
    # the plateau does not depend on N; the decay is a straight line (second differences zero)
    assert wsd_schedule(60, **(kw | {"total_steps": 1000})) == 1e-3
    lrs = [wsd_schedule(s, **kw) for s in range(80, 101)]
    assert max(abs(a - 2 * b + c) for a, b, c in zip(lrs, lrs[1:], lrs[2:], strict=False)) < 1e-18
    # no warmup, no decay: constant
    assert [wsd_schedule(s, 1.0, 0.0, 0, 0, 10) for s in range(12)] == [1.0] * 10 + [0.0] * 2


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 100), st.integers(0, 300))
def test_wsd_schedule_bounds(w, d, extra, step):
    lr = wsd_schedule(step, 2.0, 0.5, w, d, w + d + extra)
    assert 0.0 <= lr <= 2.0
    if step >= w:
        assert lr >= 0.5


def test_wsd_schedule_bad_input():
    with pytest.raises(ValueError, match="overlap"):
        wsd_schedule(0, 1.0, 0.1, 60, 50, 100)
    with pytest.raises(ValueError, match="min_lr"):
        wsd_schedule(0, 0.1, 1.0, 1, 1, 10)
    with pytest.raises(TypeError, match="step"):
        wsd_schedule(1.5, 1.0, 0.1, 1, 1, 10)
