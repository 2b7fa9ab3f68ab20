"""The build-it-yourself unit of Part IV (inference): its checks pass on the reference (the
book's own code plugged in, ``llmbook/workbench/units/build4_inference.py``) and on a plain
version of every function written here from the docstrings alone, as a reader would; each fails on
a planted bug with a message that names the problem while the exercises that do not use
the broken function still pass, every exercise has a check, and the generated stub grades
as not attempted."""

from __future__ import annotations

import importlib
import inspect
import math
import re
import types

import pytest
import torch
import torch.nn.functional as F

STEM = "build4_inference"
reference = importlib.import_module(f"llmbook.workbench.units.{STEM}")
checks = importlib.import_module("llmbook.workbench.checks.build4")

pytestmark = pytest.mark.usefixtures("one_thread")

CHECKS = {name: f for name, f in vars(checks).items()
          if name.startswith("exercise_") and inspect.isfunction(f)}


def _number(name: str) -> int:
    return int(re.match(r"exercise_(\d+)_", name).group(1))


def _uses(name: str) -> set[str]:
    return set(re.findall(r"solutions\.(\w+)", inspect.getsource(CHECKS[name])))


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_reference_passes(name: str) -> None:
    CHECKS[name](reference)


# ---------------------------------------------------------------- a reader's plain version
# Every function written from the reference's docstrings alone, with torch and math only.

def plain_apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return logits / temperature


def plain_top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p}")
    probs = torch.softmax(logits.double(), dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # the mass before each token
    keep_sorted = before < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def plain_top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    top = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, top, True)
    return logits.masked_fill(~keep, float("-inf"))


class PlainKVCache:
    def __init__(self, n_layers, batch_size, n_kv_heads, max_seq_len, d_head, dtype=torch.float32):
        self.n_layers, self.batch_size, self.n_kv_heads = n_layers, batch_size, n_kv_heads
        self.max_seq_len, self.d_head = max_seq_len, d_head
        self.length = 0
        shape = (batch_size, n_kv_heads, max_seq_len, d_head)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(n_layers)]

    def update(self, layer, k, v):
        end = self.length + k.shape[2]
        if end > self.max_seq_len:
            raise ValueError(f"{self.length} cached + {k.shape[2]} new > max_seq_len {self.max_seq_len}")
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, num_positions):
        self.length += num_positions


def plain_cached_attention(q, k, v, cache, layer):
    keys, values = cache.update(layer, k, v)
    groups = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    T, T_k = q.shape[-2], keys.shape[-2]
    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])
    allowed = torch.ones(T, T_k, dtype=torch.bool).tril(diagonal=T_k - T)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values


def plain_absmax_quantize(x, block_size=None):
    n = x.shape[-1]
    block = n if block_size is None else block_size
    if n % block:
        raise ValueError(f"block_size {block} does not divide {n}")
    xb = x.reshape(*x.shape[:-1], n // block, block)
    scale = xb.abs().amax(dim=-1) / 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(xb / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return q.reshape(x.shape), scale


def plain_absmax_dequantize(q, scale):
    n, n_blocks = q.shape[-1], scale.shape[-1]
    qb = q.reshape(*q.shape[:-1], n_blocks, n // n_blocks).to(scale.dtype)
    return (qb * scale[..., None]).reshape(q.shape)


def plain_nf4_levels():
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64),
                                        torch.tensor(1.0, dtype=torch.float64))
    offset = 1 - (1 / 32 + 1 / 30) / 2
    positive = normal.icdf(torch.linspace(offset, 0.5, 9, dtype=torch.float64)[:-1])
    negative = -normal.icdf(torch.linspace(offset, 0.5, 8, dtype=torch.float64)[:-1])
    levels = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).sort().values
    return levels / levels.max()


def plain_nf4_quantize(x, block_size=64):
    n = x.shape[-1]
    if n % block_size:
        raise ValueError(f"block_size {block_size} does not divide {n}")
    blocks = x.reshape(*x.shape[:-1], n // block_size, block_size)
    absmax = blocks.abs().amax(dim=-1, keepdim=True)
    absmax = torch.where(absmax == 0, torch.ones_like(absmax), absmax)
    levels = plain_nf4_levels().to(x.dtype)
    nearest = ((blocks / absmax)[..., None] - levels).abs().argmin(dim=-1)
    return (levels[nearest] * absmax).reshape(x.shape)


PLAIN = types.SimpleNamespace(
    apply_temperature=plain_apply_temperature, top_p_filter=plain_top_p_filter,
    top_k_filter=plain_top_k_filter, KVCache=PlainKVCache, cached_attention=plain_cached_attention,
    absmax_quantize=plain_absmax_quantize, absmax_dequantize=plain_absmax_dequantize,
    nf4_levels=plain_nf4_levels, nf4_quantize=plain_nf4_quantize)


def test_the_plain_version_covers_every_public_name() -> None:
    public = {n for n, v in vars(reference).items()
              if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
              and v.__module__ == reference.__name__}
    assert public == set(vars(PLAIN)), public ^ set(vars(PLAIN))


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_plain_version_passes_too(name: str) -> None:
    CHECKS[name](PLAIN)


# ---------------------------------------------------------------- planted bugs


def _top_p_one_too_few(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keeps a token only if the mass *including* it is below p: the last token needed is lost."""
    probs = torch.softmax(logits.double(), -1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep = torch.cumsum(sorted_probs, -1) < p
    keep[..., 0] = True
    return logits.masked_fill(~torch.zeros_like(keep).scatter(-1, order, keep), float("-inf"))


def _temperature_multiplies(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    return logits * temperature


def _top_k_keeps_ties(logits: torch.Tensor, k: int) -> torch.Tensor:
    """transformers' policy: every token tied with the k-th is kept (may be more than k)."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits, k, -1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _attention_top_left_mask(q, k, v, cache, layer):
    """The square-matrix causal mask, aligned top-left: a new token sees only the first keys."""
    keys, values = cache.update(layer, k, v)
    groups = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
    mask = torch.ones(q.shape[-2], keys.shape[-2], dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


class _CacheWritesAtZero(reference.KVCache):
    """Forgets the offset: every update overwrites positions 0 .. T-1."""

    def update(self, layer, k, v):
        self._book.keys[layer][:, :, :k.shape[2]] = k
        self._book.values[layer][:, :, :k.shape[2]] = v
        end = self.length + k.shape[2]
        return self._book.keys[layer][:, :, :end], self._book.values[layer][:, :, :end]


def _absmax_over_128(x: torch.Tensor, block_size: int | None = None):
    """Divides by 128 levels: the largest value lands on -128 .. 127's edge and is clamped."""
    q, scale = reference.absmax_quantize(x, block_size)
    scale = scale * 127 / 128
    width = x.shape[-1] // scale.shape[-1]
    xb = x.reshape(*x.shape[:-1], scale.shape[-1], width)
    q = torch.round(xb / scale[..., None]).clamp(-127, 127).to(torch.int8).reshape(x.shape)
    return q, scale


def _absmax_per_tensor(x: torch.Tensor, block_size: int | None = None):
    """One scale for the whole tensor, copied into every block's slot."""
    q, scale = reference.absmax_quantize(x.reshape(-1), None)
    blocks = 1 if block_size is None else x.shape[-1] // block_size
    return q.reshape(x.shape), scale.expand(*x.shape[:-1], blocks).clone()


def _nf4_symmetric_levels() -> torch.Tensor:
    """16 quantiles spread symmetrically: no exact zero, and not QLoRA's table."""
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    offset = 1 - 0.5 * (1 / 32 + 1 / 30)
    q = normal.icdf(torch.linspace(1 - offset, offset, 16, dtype=torch.float64))
    return q / q.abs().max()


def _nf4_per_tensor(x: torch.Tensor, block_size: int = 64) -> torch.Tensor:
    """Scales by the absmax of the whole tensor instead of each block's."""
    if x.shape[-1] % block_size:
        raise ValueError("block_size must divide the last dimension")
    amax = x.abs().max()
    levels = reference.nf4_levels().to(x.dtype)
    return levels[((x / amax)[..., None] - levels).abs().argmin(-1)] * amax


BUGS = {
    "top_p_one_too_few": ("top_p_filter", _top_p_one_too_few, {1, 6},
                          "expected top_p_filter to equal transformers' TopPLogitsWarper"),
    "temperature_multiplies": ("apply_temperature", _temperature_multiplies, {1, 6},
                               "TemperatureLogitsWarper (z / T) exactly"),
    "top_k_keeps_ties": ("top_k_filter", _top_k_keeps_ties, {2},
                         "expected exactly k = "),
    "attention_top_left_mask": ("cached_attention", _attention_top_left_mask, {3},
                                "to equal full causal attention"),
    "cache_writes_at_zero": ("KVCache", _CacheWritesAtZero, {3, 6},
                             "expected decoding in pieces with the cache to equal full causal attention"),
    "absmax_over_128": ("absmax_quantize", _absmax_over_128, {4, 6},
                        "expected the scales max|x| / 127 per block"),
    "absmax_per_tensor": ("absmax_quantize", _absmax_per_tensor, {4, 6},
                          "expected the scales max|x| / 127 per block"),
    "nf4_symmetric_levels": ("nf4_levels", _nf4_symmetric_levels, {5},
                             "expected the levels of QLoRA's published NF4 table"),
    "nf4_per_tensor": ("nf4_quantize", _nf4_per_tensor, {5, 6},
                       "expected the book's quantize_nf4"),
}


def _run(name: str, answers) -> str | None:
    """The failure message of check ``name`` on ``answers``, or None when it passes."""
    try:
        CHECKS[name](answers)
    except AssertionError as err:
        return str(err)
    return None


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_fails_its_exercise_alone(bug: str) -> None:
    function, wrong, failing, message = BUGS[bug]
    answers = types.SimpleNamespace(**{n: v for n, v in vars(reference).items() if not n.startswith("__")})
    setattr(answers, function, wrong)
    first = min(failing)
    messages = [m for name in sorted(CHECKS) if _number(name) == first and (m := _run(name, answers))]
    assert messages, f"{bug}: expected exercise {first} to fail"
    assert any(message in m for m in messages), (bug, messages)
    for name in sorted(CHECKS):
        uses = _uses(name)
        if function not in uses:  # an exercise that does not call the broken function passes
            assert _run(name, answers) is None, (bug, name)
    for n in failing - {first}:  # and the end-to-end check, which uses it, fails too
        assert any(_run(name, answers) for name in CHECKS if _number(name) == n), (bug, n)


def test_planted_bugs_are_real_bugs() -> None:
    """Each wrong variant differs from the reference on ordinary input (not only on the checks')."""
    z = torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.isfinite(_top_p_one_too_few(z, 0.9)).sum() < torch.isfinite(reference.top_p_filter(z, 0.9)).sum()
    assert not torch.equal(_temperature_multiplies(z, 0.5), reference.apply_temperature(z, 0.5))
    assert not math.isclose(float(_nf4_symmetric_levels()[7]), 0.0, abs_tol=1e-3)


# ---------------------------------------------------------------- the stub, through the grader


def test_stub_grades_as_not_attempted(tmp_path) -> None:
    from llmbook.workbench.grader import grade
    from llmbook.workbench.runner import NOT_ATTEMPTED
    from llmbook.workbench.solutions import resolve_chapter, solution_path
    from llmbook.workbench.stubs import make_stub

    assert resolve_chapter("build-IV") == STEM
    path = tmp_path / f"{STEM}.py"
    path.write_text(make_stub(solution_path(STEM).read_text(encoding="utf-8"), STEM), encoding="utf-8")
    rows = grade("build-IV", path)
    assert [r.exercise for r in rows] == sorted(checks.EXERCISES)
    assert all(r.status == NOT_ATTEMPTED for r in rows), [(r.exercise, r.status, r.detail) for r in rows]
