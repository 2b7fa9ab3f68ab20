"""The build-it-yourself unit of Part II (the transformer block): its checks pass on the
reference (the book's own modules plugged in, ``llmbook/workbench/units/build2_transformer.py``)
and on a plain version of every function written here as a reader would; each planted bug
fails its exercise with a message naming the problem while the exercises that do not call
the broken function still pass; every exercise has a check; the generated stub grades as
not attempted.

SmolLM2 is loaded once for the whole file (the end-to-end check runs several times): its
loader is replaced by one that hands out a fresh copy of the model loaded the first time.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import re
import types

import pytest
import torch

STEM = "build2_transformer"
reference = importlib.import_module(f"llmbook.workbench.units.{STEM}")
checks = importlib.import_module("llmbook.workbench.checks.build2")

pytestmark = pytest.mark.usefixtures("one_thread", "smollm2_once")

CHECKS = {name: f for name, f in vars(checks).items()
          if name.startswith("exercise_") and inspect.isfunction(f)}
NAMES = ("softmax", "attention", "apply_rope", "rms_norm", "swiglu", "transformer_block")
END_TO_END = max(CHECKS, key=lambda n: int(re.match(r"exercise_(\d+)_", n).group(1)))


@pytest.fixture(scope="module")
def smollm2_once():
    import llmbook.inference.gguf as gguf

    original = gguf.load_model
    model, tok = original()

    def fresh_copy(*args, **kwargs):
        assert not args and not kwargs, "the end-to-end check loads the default model"
        return copy.deepcopy(model), tok

    gguf.load_model = fresh_copy
    yield
    gguf.load_model = original


def _number(name: str) -> int:
    return int(re.match(r"exercise_(\d+)_", name).group(1))


def _uses(name: str) -> set[str]:
    return set(re.findall(r"solutions\.(\w+)", inspect.getsource(CHECKS[name])))


def _with(base=reference, **replaced) -> types.SimpleNamespace:
    """The functions of ``base``, with some replaced."""
    found = {n: getattr(base, n) for n in NAMES}
    found.update(replaced)
    return types.SimpleNamespace(**found)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_reference_passes(name: str) -> None:
    CHECKS[name](reference)


def test_the_end_to_end_exercise_runs_block_norm_and_softmax_together() -> None:
    assert _uses(END_TO_END) == {"transformer_block", "rms_norm", "softmax"}


# ---------------------------------------------------------------- a reader's plain version

def plain_softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def plain_attention(q, k, v, mask=None, is_causal=False, bottom_right=False, nan_rows=False):
    T_q, T_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(T_q, T_k, dtype=torch.bool).tril(T_k - T_q if bottom_right else 0)
    if mask is None:
        return plain_softmax(scores) @ v
    scores = scores.masked_fill(~mask, float("-inf"))
    if nan_rows:
        return plain_softmax(scores) @ v
    dead = (~mask).all(dim=-1, keepdim=True)
    weights = plain_softmax(scores.masked_fill(dead, 0.0)).masked_fill(dead, 0.0)
    return weights @ v


def plain_rope(x, positions, theta=10000.0, interleaved=False):
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = positions.to(torch.float64)[:, None] * inv  # (T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def plain_rms_norm(x, weight, eps=1e-6):
    h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def plain_swiglu(x, w_gate, w_up, w_down):
    gate = x @ w_gate.T
    return (gate * torch.sigmoid(gate) * (x @ w_up.T)) @ w_down.T


def make_block(repeat="interleave", fixed_theta=None, upcast=False):
    """A reader's block, from the plain pieces; the keywords plant bugs."""

    def transformer_block(x, weights, n_heads, n_kv_heads, theta=10000.0, eps=1e-5):
        if upcast:
            x = x.double()
            weights = {n: w.double() for n, w in weights.items()}
        theta = theta if fixed_theta is None else fixed_theta
        B, T, d = x.shape
        d_head = weights["q_proj"].shape[0] // n_heads
        positions = torch.arange(T)

        def heads(t, n):
            return t.view(B, T, n, d_head).transpose(1, 2)

        h = plain_rms_norm(x, weights["attn_norm"], eps)
        q = plain_rope(heads(h @ weights["q_proj"].T, n_heads), positions, theta)
        k = plain_rope(heads(h @ weights["k_proj"].T, n_kv_heads), positions, theta)
        v = heads(h @ weights["v_proj"].T, n_kv_heads)
        groups = n_heads // n_kv_heads
        if repeat == "interleave":
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        else:  # head h gets key/value head h % H_kv instead of h // groups
            k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
        z = plain_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, n_heads * d_head)
        x = x + z @ weights["o_proj"].T
        h = plain_rms_norm(x, weights["mlp_norm"], eps)
        return x + plain_swiglu(h, weights["gate_proj"], weights["up_proj"], weights["down_proj"])

    return transformer_block


PLAIN = types.SimpleNamespace(softmax=plain_softmax, attention=plain_attention, apply_rope=plain_rope,
                              rms_norm=plain_rms_norm, swiglu=plain_swiglu, transformer_block=make_block())


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_plain_version_passes_too(name: str) -> None:
    CHECKS[name](PLAIN)


# ---------------------------------------------------------------- planted bugs

def softmax_without_shift(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def rms_norm_centred(x, weight, eps=1e-6):  # LayerNorm's centring, without its bias
    return plain_rms_norm(x - x.mean(dim=-1, keepdim=True), weight, eps)


def rms_norm_in_bfloat16(x, weight, eps=1e-6):  # no float32 step for half-precision input
    return weight * x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def swiglu_gating_the_wrong_branch(x, w_gate, w_up, w_down):
    up = x @ w_up.T
    return (up * torch.sigmoid(up) * (x @ w_gate.T)) @ w_down.T


BUGS = [  # (name, function, the exercises that must fail, a pattern of the first failure)
    ("softmax", softmax_without_shift, {1}, r"finite probabilities for float32 logits of size 1e4"),
    ("attention", lambda q, k, v, mask=None, is_causal=False:
        plain_attention(q, k, v, mask, is_causal, bottom_right=True), {2},
     r"is_causal=True \(T_q = 5, T_k = 7, aligned top left\) to equal torch's"),
    ("attention", lambda q, k, v, mask=None, is_causal=False:
        plain_attention(q, k, v, mask, is_causal, nan_rows=True), {2},
     r"expected zeros \(and no NaN\) for query 3 of batch entry 1, whose keys are all masked"),
    ("apply_rope", lambda x, positions, theta=10000.0: plain_rope(x, positions, theta, interleaved=True),
     {3}, r"half-split pairs \(j, j \+ d/2\).*RotaryEmbedding"),
    ("apply_rope", lambda x, positions, theta=10000.0: plain_rope(x, positions), {3}, r"theta = 500"),
    ("rms_norm", rms_norm_centred, {4, 7}, r"rms_norm with eps = 1e-06 to equal torch.nn.RMSNorm"),
    ("rms_norm", rms_norm_in_bfloat16, {4}, r"torch.bfloat16 input to equal transformers' LlamaRMSNorm "
                                            r"to one bfloat16 step"),
    ("swiglu", swiglu_gating_the_wrong_branch, {5}, r"swiglu to equal transformers' LlamaMLP"),
    ("transformer_block", make_block(repeat="tile"), {6, 7},
     r"H_kv = 2.*to equal the book's DecoderBlock"),
    ("transformer_block", make_block(fixed_theta=10000.0), {6, 7}, r"theta = 500.0"),
    ("transformer_block", make_block(upcast=True), {7},
     r"transformer_block on float32 input to return torch.float32, got torch.float64"),
]


@pytest.mark.parametrize(("name", "bug", "failing", "message"), BUGS,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BUGS)])
def test_a_planted_bug_fails_its_exercise_and_only_where_it_is_used(name, bug, failing, message):
    answers = _with(**{name: bug})
    for check, run in sorted(CHECKS.items()):
        if _number(check) not in failing and name not in _uses(check):
            continue  # it calls only the reference's functions: covered by the reference's test
        if _number(check) in failing:
            with pytest.raises(AssertionError) as err:
                run(answers)
            if _number(check) == min(failing):
                assert re.search(message, str(err.value)), str(err.value)
        else:
            run(answers)  # uses the broken function, and still passes


# ---------------------------------------------------------------- the stub and the grader

def test_the_stub_grades_as_not_attempted(tmp_path):
    from llmbook.workbench.grader import grade
    from llmbook.workbench.runner import NOT_ATTEMPTED
    from llmbook.workbench.stubs import make_stub

    stub = tmp_path / f"{STEM}.py"
    stub.write_text(make_stub(inspect.getsource(reference), STEM), encoding="utf-8")
    text = stub.read_text(encoding="utf-8")
    assert "from llmbook" not in text and "BLOCK_WEIGHTS = (" in text
    rows = grade("build-II", stub)
    assert [r.exercise for r in rows] == sorted(checks.EXERCISES)
    assert all(r.status == NOT_ATTEMPTED for r in rows), [(r.exercise, r.status, r.detail) for r in rows]
