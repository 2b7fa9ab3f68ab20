"""Tests for llmbook.training.train: batches, token files, the config, evaluation, the loop, exact resume."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.text.data import default_source
from llmbook.training.optim import cosine_schedule
from llmbook.training.train import (
    TrainConfig,
    TrainHistory,
    evaluate,
    get_batch,
    load_tokens,
    param_groups,
    save_tokens,
    train,
    train_step,
    z_loss,
)
from llmbook.transformer.model import TransformerConfig, TransformerLM

V, T = 16, 12


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data():
    return default_source().train_val(20_000, 4_000, seed=3)


def tiny_model(seed=0, style="gpt2"):
    make = TransformerConfig.gpt2_style if style == "gpt2" else TransformerConfig.llama_style
    cfg = make(vocab_size=V, d_model=24, n_layers=1, n_heads=2, max_seq_len=T)
    return TransformerLM(cfg, generator=torch.Generator().manual_seed(seed))


def tiny_config(**kw):
    base = dict(steps=12, batch_size=6, context_length=T, lr=1e-2, min_lr=1e-3, warmup_steps=2,
                eval_every=4, eval_batches=2, seed=5)
    base.update(kw)
    return TrainConfig(**base)


# ---------------------------------------------------------------- get_batch


def test_get_batch_worked_example():
    tokens = np.arange(100, 120)  # token i sits at offset i - 100
    g = torch.Generator().manual_seed(0)
    x, y = get_batch(tokens, 3, 5, generator=g)
    offsets = torch.randint(0, 20 - 5, (3,), generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 5) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 0], offsets + 100)
    assert torch.equal(x, (offsets[:, None] + torch.arange(5)) + 100)
    assert torch.equal(y, x + 1)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 60), b=st.integers(1, 7), t=st.integers(1, 59), seed=st.integers(0, 99))
def test_get_batch_shift_and_range(n, b, t, seed):
    if t >= n:
        with pytest.raises(ValueError, match="not shorter than the data"):
            get_batch(torch.arange(n), b, t)
        return
    tokens = torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(seed))
    x, y = get_batch(tokens, b, t, generator=torch.Generator().manual_seed(seed))
    assert x.shape == (b, t)
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    # every window is a contiguous piece of the data
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        window = row_x + row_y[-1:]
        starts = [i for i in range(n - t) if tokens[i : i + t + 1].tolist() == window]
        assert starts


def test_get_batch_deterministic_and_same_for_numpy_torch_memmap(tmp_path):
    tokens = default_source().sample(5_000, seed=1)
    path = save_tokens(tmp_path / "tokens.bin", tokens)
    mm = load_tokens(path)
    assert isinstance(mm, np.memmap) and mm.dtype == np.uint16 and mm.shape == (5_000,)
    batches = [get_batch(src, 4, 32, generator=torch.Generator().manual_seed(9))
               for src in (tokens, tokens.numpy(), tokens.to(torch.int32), mm)]
    for x, y in batches[1:]:
        assert torch.equal(x, batches[0][0]) and torch.equal(y, batches[0][1])
    g = torch.Generator().manual_seed(9)
    first, second = get_batch(mm, 4, 32, generator=g), get_batch(mm, 4, 32, generator=g)
    assert not torch.equal(first[0], second[0])  # the generator moves on


def test_get_batch_bad_input():
    with pytest.raises(ValueError, match=r"context_length=10 is not shorter than the data \(10 "):
        get_batch(np.arange(10), 2, 10)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        get_batch(np.arange(10), 0, 3)
    with pytest.raises(ValueError, match="context_length must be a positive int"):
        get_batch(np.arange(10), 2, -1)
    with pytest.raises(ValueError, match=r"must be 1-D .* shape \(2, 5\)"):
        get_batch(np.zeros((2, 5), dtype=np.int64), 1, 2)
    with pytest.raises(TypeError, match="integer token ids, got dtype torch.float32"):
        get_batch(torch.zeros(10), 1, 2)
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        get_batch(list(range(10)), 1, 2)


def test_save_load_tokens_round_trip_and_errors(tmp_path):
    ids = np.array([0, 1, 65535, 300, 7])
    path = save_tokens(tmp_path / "a.bin", ids)
    assert path.stat().st_size == 2 * len(ids)
    assert load_tokens(path).tolist() == ids.tolist()
    path32 = save_tokens(tmp_path / "b.bin", torch.tensor([70000, 1]), dtype=np.uint32)
    assert load_tokens(path32, dtype=np.uint32).tolist() == [70000, 1]
    with pytest.raises(ValueError, match="token id 70000 does not fit in uint16"):
        save_tokens(tmp_path / "c.bin", np.array([70000]))
    with pytest.raises(ValueError, match="token id -1 does not fit"):
        save_tokens(tmp_path / "c.bin", np.array([-1, 2]))
    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(ValueError, match="odd.bin has 3 bytes"):
        load_tokens(tmp_path / "odd.bin")
    with pytest.raises(FileNotFoundError, match="no token file"):
        load_tokens(tmp_path / "missing.bin")


# ---------------------------------------------------------------- TrainConfig


def test_train_config_defaults_and_dict():
    c = TrainConfig()
    assert (c.steps, c.lr, c.betas, c.checkpoint_every) == (1000, 1e-3, (0.9, 0.95), None)
    assert TrainConfig(**{**c.to_dict(), "betas": tuple(c.to_dict()["betas"])}) == c


@pytest.mark.parametrize("kw, match", [
    (dict(lr=-1e-3), "lr must be finite and >= 0.0, got lr=-0.001"),
    (dict(lr=float("nan")), "lr must be finite"),
    (dict(min_lr=-1.0), "min_lr must be"),
    (dict(lr=1e-3, min_lr=1e-2), "min_lr=0.01 must not exceed lr=0.001"),
    (dict(steps=10, warmup_steps=11), r"warmup_steps=11 must lie in \[0, steps=10\]"),
    (dict(warmup_steps=-1), "warmup_steps=-1"),
    (dict(steps=0), "steps must be a positive int"),
    (dict(batch_size=-2), "batch_size must be a positive int"),
    (dict(context_length=0), "context_length must be a positive int"),
    (dict(betas=(0.9, 1.0)), r"beta2 must be finite and in \[0.0, 1.0\)"),
    (dict(betas=(0.9,)), "betas must be a pair"),
    (dict(weight_decay=-0.1), "weight_decay must be"),
    (dict(grad_clip=0.0), "grad_clip must be positive"),
    (dict(eval_every=0), "eval_every must be a positive int"),
    (dict(checkpoint_every=-5), "checkpoint_every must be a positive int"),
])
def test_train_config_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kw)


def test_schedule_bad_input_matches_config():
    with pytest.raises(ValueError, match="max_lr must be >= 0.0"):
        cosine_schedule(0, -1e-3, 0.0, 0, 10)
    with pytest.raises(ValueError, match="a warmup longer than the schedule"):
        cosine_schedule(0, 1e-3, 0.0, 11, 10)


# ---------------------------------------------------------------- step, groups, evaluate


def test_param_groups_decay_matrices_only():
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    named = dict(model.named_parameters())
    by_id = {id(p): n for n, p in named.items()}
    assert {by_id[id(p)] for p in decay["params"]} == {n for n, p in named.items() if p.ndim == 2}
    assert "embed.weight" in {by_id[id(p)] for p in decay["params"]}
    assert all(named[by_id[id(p)]].ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_train_step_loss_is_cross_entropy_and_clips(data):
    model = tiny_model()
    from llmbook.training.optim import AdamW

    opt = AdamW(param_groups(model, 0.0), lr=1e-3)
    x, y = get_batch(data[0], 5, T, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    before = [p.clone() for p in model.parameters()]
    loss, norm = train_step(model, opt, x, y, lr=1e-3, grad_clip=1e-3)
    assert abs(loss.item() - expected.item()) < 1e-6
    assert norm > 1e-3  # it clipped: the returned norm is the norm before clipping
    total = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    assert total <= 1e-3 * (1 + 1e-5)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert opt.param_groups[0]["lr"] == 1e-3


def test_train_step_bf16_autocast_is_torch_autocast_with_float32_loss(data):
    """The peer: the same forward under torch.autocast, with F.cross_entropy (autocast's float32 loss)."""
    from llmbook.training.optim import AdamW

    model, ref = tiny_model(), tiny_model()
    x, y = get_batch(data[0], 5, T, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits16 = ref(x)
        expected = F.cross_entropy(logits16.reshape(-1, V), y.reshape(-1))
    assert logits16.dtype == torch.bfloat16 and expected.dtype == torch.float32
    with torch.no_grad():
        full = F.cross_entropy(ref(x).reshape(-1, V), y.reshape(-1))
    opt = AdamW(param_groups(model, 0.1), lr=1e-3)
    loss, _ = train_step(model, opt, x, y, lr=1e-3, grad_clip=1.0, autocast_dtype=torch.bfloat16)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - expected.item()) < 1e-6  # the same bf16 logits, the loss in float32
    assert abs(loss.item() - full.item()) > 1e-6  # and not the float32 forward
    assert abs(loss.item() - full.item()) < 2.0**-6 * full.item()  # but within a few bf16 ulps of it
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert all(v.dtype == torch.float32 for st_ in opt.state.values() for v in st_.values() if v.ndim)


def test_train_bf16_autocast_runs_close_to_float32(data):
    config = tiny_config(steps=12, eval_every=None)
    a, b = tiny_model(), tiny_model()
    ha = train(a, data[0], None, config)
    hb = train(b, data[0], None, config, autocast_dtype=torch.bfloat16)
    diffs = np.abs(np.array(ha.train_loss) - np.array(hb.train_loss))
    assert 0 < diffs.max() < 0.05
    with pytest.raises(ValueError, match="autocast_dtype"):
        train(tiny_model(), data[0], None, config, autocast_dtype=torch.float64)
    with pytest.raises(ValueError, match="autocast_dtype"):
        train_step(a, torch.optim.SGD(a.parameters(), lr=0.1), *get_batch(data[0], 2, T), lr=0.1,
                   autocast_dtype="bfloat16")


def test_z_loss_worked_example_peers_and_gradient():
    from transformers.models.switch_transformers.modeling_switch_transformers import (
        router_z_loss_func,
    )

    from llmbook.scale.moe import router_z_loss

    z = torch.zeros(2, 3, 4, dtype=torch.float64)  # log Z = log 4 everywhere
    assert float(z_loss(z)) == pytest.approx(math.log(4) ** 2, abs=1e-15)
    z = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)  # Z = 4
    assert float(z_loss(z)) == pytest.approx(math.log(4) ** 2, abs=1e-15)
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(3, 5, 7, generator=g, dtype=torch.float64)  # B != T != V
    assert torch.allclose(z_loss(logits), router_z_loss_func(logits), atol=1e-14, rtol=0)
    assert torch.allclose(z_loss(logits), router_z_loss(logits.reshape(-1, 7)), atol=1e-14, rtol=0)
    # gradient: 2 log Z softmax(z) / n, and torch's float64 finite differences
    x = logits.clone().requires_grad_(True)
    z_loss(x).backward()
    expected = 2 * torch.logsumexp(logits, -1, keepdim=True) * torch.softmax(logits, -1) / 15
    assert torch.allclose(x.grad, expected, atol=1e-14, rtol=0)
    assert torch.autograd.gradcheck(z_loss, (logits.clone().requires_grad_(True),))
    # shift: adding c to every logit changes log Z by c; c = -log Z makes it 0
    assert float(z_loss(logits - torch.logsumexp(logits, -1, keepdim=True))) < 1e-28


@given(st.integers(1, 4), st.integers(1, 6), st.integers(2, 9), st.integers(0, 10_000))
@settings(max_examples=25, deadline=None)
def test_z_loss_ignores_masked_positions(b, t, v, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g, dtype=torch.float64)
    targets = torch.randint(0, v, (b, t), generator=g)
    targets[0, 0] = -100
    keep = targets != -100
    if keep.any():
        assert torch.allclose(z_loss(logits, targets), z_loss(logits[keep]), atol=1e-14, rtol=0)
    assert float(z_loss(logits)) >= 0


def test_z_loss_bad_input_and_train_option(data):
    with pytest.raises(TypeError, match="logits"):
        z_loss(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="targets"):
        z_loss(torch.zeros(2, 3, 4), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="ignore_index"):
        z_loss(torch.zeros(2, 4), torch.full((2,), -100))
    with pytest.raises(ValueError, match="z_loss_weight"):
        train(tiny_model(), data[0], None, tiny_config(eval_every=None), z_loss_weight=-1.0)
    # the option pulls log Z towards 0 and leaves the logged loss the cross-entropy
    config = tiny_config(steps=12, eval_every=None)
    a, b = tiny_model(), tiny_model()
    ha = train(a, data[0], None, config)
    hb = train(b, data[0], None, config, z_loss_weight=0.5)
    assert ha.train_loss[0] == hb.train_loss[0]  # the same first forward
    x, _ = get_batch(data[0], 8, T, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        lz_a = torch.logsumexp(a(x), -1).pow(2).mean()
        lz_b = torch.logsumexp(b(x), -1).pow(2).mean()
    assert lz_b < lz_a


def test_evaluate_matches_manual_and_restores_mode(data):
    model = tiny_model().train()
    g = torch.Generator().manual_seed(4)
    got = evaluate(model, data[1], 7, T, 3, generator=g)
    g = torch.Generator().manual_seed(4)
    manual = []
    with torch.no_grad():
        for _ in range(3):
            x, y = get_batch(data[1], 7, T, generator=g)
            manual.append(F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)).item())
    assert abs(got - sum(manual) / 3) < 1e-6
    assert model.training
    assert evaluate(model, data[1], 7, T, 3) == evaluate(model, data[1], 7, T, 3)  # generator=None
    late = evaluate(model, data[1], 7, T, 3, first_position=T - 1)
    assert late != evaluate(model, data[1], 7, T, 3)
    with pytest.raises(ValueError, match="first_position"):
        evaluate(model, data[1], 7, T, 3, first_position=T)
    with pytest.raises(ValueError, match="num_batches must be a positive int"):
        evaluate(model, data[1], 7, T, 0)


# ---------------------------------------------------------------- the loop


def test_train_learns_and_records_history(capsys):
    counting = torch.arange(3_000) % V  # next token = this token + 1 (mod V): easy to learn
    model = tiny_model()
    cfg = tiny_config(steps=40, batch_size=32, lr=3e-2, log_every=10, eval_every=10)
    h = train(model, counting, counting[:500], cfg)
    assert isinstance(h, TrainHistory)
    assert h.steps == list(range(40)) and len(h.train_loss) == len(h.lr) == 40
    assert h.val_steps == [0, 10, 20, 30, 40]
    assert h.tokens_seen == 40 * 32 * T and h.seconds > 0
    assert h.lr[0] == 0.0 and h.lr[2] == pytest.approx(3e-2)
    assert h.val_loss[0] > 2.5 and h.val_loss[-1] < 0.5  # it learned the rule
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step  0/40  train ") and out[-1].startswith("step 40/40  val ")
    assert len(out) == 5


def test_train_is_deterministic(data):
    runs = []
    for _ in range(2):
        model = tiny_model(style="llama")
        runs.append((train(model, data[0], data[1], tiny_config()), model))
    assert runs[0][0].train_loss == runs[1][0].train_loss
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1].parameters(), runs[1][1].parameters(),
                                                 strict=True))


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_resume_reproduces_uninterrupted_run_exactly(data, tmp_path, style):
    cfg = tiny_config(steps=16, checkpoint_every=4)
    straight = tiny_model(style=style)
    h_straight = train(straight, data[0], data[1], cfg)

    path = tmp_path / "run.pt"
    first = tiny_model(style=style)
    train(first, data[0], data[1], cfg, checkpoint_path=path, stop_at=8)
    torch.manual_seed(123)  # disturb the global RNG: the checkpoint restores it
    resumed = tiny_model(seed=99, style=style)  # fresh objects, different initial weights
    h_resumed = train(resumed, data[0], data[1], cfg, checkpoint_path=path, resume=True)

    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    assert h_resumed.train_loss == h_straight.train_loss
    assert h_resumed.val_loss == h_straight.val_loss and h_resumed.val_steps == h_straight.val_steps
    assert h_resumed.lr == h_straight.lr and h_resumed.tokens_seen == h_straight.tokens_seen


def test_train_bad_input(data, tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match="context_length=12 is not shorter than the training"):
        train(model, data[0][:12], data[1], tiny_config())
    with pytest.raises(ValueError, match="not shorter than the validation data"):
        train(model, data[0], data[1][:5], tiny_config())
    with pytest.raises(TypeError, match="config must be a TrainConfig"):
        train(model, data[0], data[1], {"steps": 3})
    with pytest.raises(ValueError, match="resume=True needs a checkpoint_path"):
        train(model, data[0], data[1], tiny_config(), resume=True)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        train(model, data[0], data[1], tiny_config(), checkpoint_path=tmp_path / "x.pt",
              resume=True)
    path = tmp_path / "r.pt"
    train(model, data[0], None, tiny_config(steps=4), checkpoint_path=path)
    with pytest.raises(ValueError, match=r"config changed \(lr: 0.01 -> 0.02\)"):
        train(tiny_model(), data[0], None, tiny_config(steps=4, lr=2e-2), checkpoint_path=path,
              resume=True)
    other = TransformerLM(TransformerConfig.gpt2_style(vocab_size=V, d_model=32, n_layers=1,
                                                       n_heads=2, max_seq_len=T))
    with pytest.raises(ValueError, match="shape mismatches"):
        train(other, data[0], None, tiny_config(steps=4), checkpoint_path=path, resume=True)
