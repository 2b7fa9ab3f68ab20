"""Tests for llmbook.scale.context_parallel: ring attention, zig-zag, Ulysses, their bytes."""

from __future__ import annotations

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.inference.flash import flash_attention_tiled
from llmbook.scale import context_parallel as cp
from llmbook.scale.launch import WorkerError, run

pytestmark = pytest.mark.usefixtures("one_thread")
f64 = torch.float64


_SYM = cp.context_parallel_bytes_symbolic()
_NAMES = sp.symbols("B H T d p b", positive=True, integer=True)
_RING = sp.lambdify(_NAMES, _SYM["ring"], "sympy")
_ULYSSES = sp.lambdify(_NAMES, _SYM["ulysses"], "sympy")


def _qkv(B: int, H: int, T: int, d_k: int, d_v: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = gen(seed)
    return (torch.randn(B, H, T, d_k, generator=g, dtype=f64),
            torch.randn(B, H, T, d_k, generator=g, dtype=f64),
            torch.randn(B, H, T, d_v, generator=g, dtype=f64),
            torch.randn(B, H, T, d_v, generator=g, dtype=f64))


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_with_grads_equals_chapter_14_tiled_attention(is_causal: bool) -> None:
    q, k, v, go = _qkv(2, 3, 7, 4, 5, seed=11)
    got = cp.sdpa_with_grads(q, k, v, go, is_causal)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention_tiled(*leaves, is_causal=is_causal, block_q=3, block_k=2)
    out.backward(go)
    for name, want in zip(("out", "dq", "dk", "dv"), (out.detach(), *(t.grad for t in leaves)),
                          strict=True):
        torch.testing.assert_close(got[name], want, rtol=1e-12, atol=1e-12)
    assert q.grad is None  # the caller's tensors are left alone
    with pytest.raises(ValueError, match="grad_out"):
        cp.sdpa_with_grads(q, k, v, go[..., :2])
    with pytest.raises(TypeError, match="grad_out"):
        cp.sdpa_with_grads(q, k, v, go.long())


# ---------------------------------------------------------------- layouts and work


def test_chunk_layout_worked_example() -> None:
    assert cp.chunk_layout(3) == [[0], [1], [2]]
    assert cp.chunk_layout(3, "zigzag") == [[0, 5], [1, 4], [2, 3]]
    with pytest.raises(ValueError, match="layout"):
        cp.chunk_layout(2, "striped")
    with pytest.raises(ValueError, match="world_size"):
        cp.chunk_layout(0)


def test_shard_worked_example_and_bad_input() -> None:
    x = torch.arange(12, dtype=f64).reshape(1, 12, 1)
    assert cp.shard_sequence(x, 1, 3, "zigzag").flatten().tolist() == [2, 3, 8, 9]
    assert cp.shard_sequence(x, 2, 3).flatten().tolist() == [8, 9, 10, 11]
    with pytest.raises(ValueError, match="multiple of 6"):
        cp.shard_sequence(x[:, :8], 0, 3, "zigzag")
    with pytest.raises(ValueError, match="rank"):
        cp.shard_sequence(x, 3, 3)
    with pytest.raises(TypeError, match="^x must be a floating-point"):
        cp.shard_sequence(torch.arange(12).reshape(1, 12, 1), 0, 3)
    with pytest.raises(TypeError, match="shards"):
        cp.gather_sequence([])
    with pytest.raises(ValueError, match="shape"):
        cp.gather_sequence([x[:, :4], x[:, :6]])


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 5), c=st.integers(1, 4), layout=st.sampled_from(cp.LAYOUTS))
def test_gather_inverts_shard(p: int, c: int, layout: str) -> None:
    T = c * p * len(cp.chunk_layout(1, layout)[0])
    x = torch.randn(2, T, 3, generator=gen(p * 10 + c), dtype=f64)
    shards = [cp.shard_sequence(x, r, p, layout) for r in range(p)]
    assert all(s.shape == (2, T // p, 3) for s in shards)
    assert torch.equal(cp.gather_sequence(shards, layout), x)


def test_causal_work_worked_example() -> None:
    # T = 8, p = 2: contiguous ranks own queries 0-3 (1+2+3+4) and 4-7 (5+6+7+8)
    assert cp.causal_work_per_rank(8, 2) == [10, 26]
    # zig-zag: rank 0 has chunks 0, 3 -> (1+2) + (7+8); rank 1 has 1, 2 -> (3+4) + (5+6)
    assert cp.causal_work_per_rank(8, 2, "zigzag") == [18, 18]


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 6), c=st.integers(1, 5))
def test_causal_work_sums_to_triangle_and_matches_sympy(p: int, c: int) -> None:
    T = 2 * p * c
    sym = cp.causal_work_symbolic()
    Ts, ps, rs = sp.symbols("T p", positive=True, integer=True) + (sp.Symbol("r", nonnegative=True, integer=True),)
    for layout in cp.LAYOUTS:
        work = cp.causal_work_per_rank(T, p, layout)
        assert sum(work) == T * (T + 1) // 2  # a brute-force count of the triangle
        assert work == [sym[layout].subs({Ts: T, ps: p, rs: r}) for r in range(p)]
    assert len(set(cp.causal_work_per_rank(T, p, "zigzag"))) == 1
    mask = torch.ones(T, T).tril()  # direct count of unmasked entries per contiguous shard
    assert cp.causal_work_per_rank(T, p) == [int(m.sum()) for m in mask.chunk(p)]
    worst = max(cp.causal_work_per_rank(T, p)) / (T * (T + 1) / 2 / p)
    assert worst == pytest.approx(float(sym["imbalance_contiguous"].subs({Ts: T, ps: p})))


# ---------------------------------------------------------------- byte formulas


def test_byte_formulas_worked_examples() -> None:
    # ring, p = 3, local K (2, 4, 4, 5), d_v = 3: n = 160 + 96 = 256 elements, 8 bytes
    got = cp.ring_attention_bytes_per_rank((2, 4, 4, 5), 3, 3)
    assert got == {"forward": 2 * 256 * 8, "backward": 5 * 256 * 8, "total": 7 * 256 * 8}
    assert cp.ring_attention_bytes_per_rank((2, 4, 4, 5), 3, 1)["total"] == 0
    # Ulysses, p = 2, local (2, 4, 6, 5) and d_v = 3: half of 2 (240 + 144) elements per pass
    assert cp.ulysses_bytes_per_rank((2, 4, 6, 5), 3, 2) == {"forward": 3072, "backward": 3072,
                                                               "total": 6144}
    with pytest.raises(ValueError, match="divide the heads"):
        cp.ulysses_bytes_per_rank((2, 3, 6, 5), 3, 2)
    with pytest.raises(ValueError, match="shape_qk"):
        cp.ulysses_bytes_per_rank((2, 6, 5), 3, 2)
    with pytest.raises(ValueError, match="shape_k"):
        cp.ring_attention_bytes_per_rank((5,), 3, 2)


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 4), t=st.integers(1, 5), d=st.integers(1, 6),
       p=st.integers(2, 6), b=st.sampled_from([2, 4, 8]))
def test_byte_formulas_match_sympy(B: int, H: int, t: int, d: int, p: int, b: int) -> None:
    # the SymPy sums hold for p >= 2 (one rank sends nothing, see the worked example)
    subs = dict(zip(_NAMES, (B, H * p, t * p, d, p, b), strict=True))
    assert cp.ring_attention_bytes_per_rank((B, H * p, t, d), d, p, b)["total"] == _RING(*subs.values())
    assert cp.ulysses_bytes_per_rank((B, H * p, t, d), d, p, b)["total"] == _ULYSSES(*subs.values())


def test_counter_sums_by_kind() -> None:
    c = cp.CommCounter()
    c.record("ring forward", 10)
    c.record("ring backward kv", 7)
    assert c.bytes() == 17 and c.bytes("ring backward") == 7 and c.bytes("ulysses") == 0


# ---------------------------------------------------------------- the real runs


@pytest.mark.parametrize(("p", "layout", "is_causal"), [
    (2, "contiguous", False), (2, "zigzag", True), (3, "contiguous", True), (3, "zigzag", False)])
def test_ring_attention_equals_sdpa(p: int, layout: str, is_causal: bool) -> None:
    B, H, T, d_k, d_v = 2, 3, 12, 5, 4
    q, k, v, go = _qkv(B, H, T, d_k, d_v, seed=p)
    ref = cp.sdpa_with_grads(q, k, v, go, is_causal)
    res = run(cp.ring_attention_worker, p, q, k, v, go, is_causal, layout, timeout=60)
    for name in ("out", "dq", "dk", "dv"):
        got = cp.gather_sequence([r[name] for r in res], layout)
        torch.testing.assert_close(got, ref[name], rtol=1e-12, atol=1e-12)
    want = cp.ring_attention_bytes_per_rank((B, H, T // p, d_k), d_v, p)
    for r in res:
        sent = cp.CommCounter(r["calls"])
        assert sent.bytes("ring forward") == want["forward"]
        assert sent.bytes("ring backward") == want["backward"]
    if is_causal:
        assert [r["work"] for r in res] == [B * H * w for w in cp.causal_work_per_rank(T, p, layout)]
    else:
        assert all(r["work"] == B * H * T * T // p for r in res)


@pytest.mark.parametrize("is_causal", [False, True])
def test_ulysses_equals_sdpa(is_causal: bool) -> None:
    B, H, T, d_k, d_v, p = 2, 4, 6, 5, 3, 2
    q, k, v, go = _qkv(B, H, T, d_k, d_v, seed=7)
    ref = cp.sdpa_with_grads(q, k, v, go, is_causal)
    res = run(cp.ulysses_attention_worker, p, q, k, v, go, is_causal, timeout=60)
    for name in ("out", "dq", "dk", "dv"):
        torch.testing.assert_close(cp.gather_sequence([r[name] for r in res]), ref[name],
                                   rtol=1e-12, atol=1e-12)
    want = cp.ulysses_bytes_per_rank((B, H, T // p, d_k), d_v, p)
    for r in res:
        sent = cp.CommCounter(r["calls"])
        assert sent.bytes() == want["total"]
        assert sent.bytes() - sent.bytes("ulysses q") - sent.bytes("ulysses k") - \
            sent.bytes("ulysses v") - sent.bytes("ulysses out") == 0


def _gradcheck_single_rank(rank: int, world_size: int) -> bool:
    q, k, v, _ = _qkv(1, 2, 6, 3, 2, seed=3)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    return torch.autograd.gradcheck(
        lambda a, b, c: cp.ring_attention(a, b, c, is_causal=True, layout="zigzag"), (q, k, v))


def test_ring_attention_gradcheck_float64() -> None:
    assert run(_gradcheck_single_rank, 1, timeout=60) == [True]


def _bad_heads(rank: int, world_size: int) -> None:
    x = torch.zeros(1, 3, 2, 4, dtype=f64)
    cp.ulysses_attention(x, x, x)


def _bad_shapes(rank: int, world_size: int) -> None:
    cp.ring_attention(torch.zeros(1, 3, 4, dtype=f64), torch.zeros(1, 2, 4, dtype=f64),
                      torch.zeros(1, 2, 4, dtype=f64))


def test_bad_input() -> None:
    with pytest.raises(WorkerError, match="divide the number of heads"):
        run(_bad_heads, 2, timeout=30)
    with pytest.raises(WorkerError, match="local shards"):
        run(_bad_shapes, 1, timeout=30)
    with pytest.raises(RuntimeError, match="not initialised"):
        cp.ring_attention(*(torch.zeros(1, 2, 4, dtype=f64),) * 3)
    with pytest.raises(ValueError, match="layout"):
        cp.ring_attention(*(torch.zeros(1, 2, 4, dtype=f64),) * 3, layout="striped")
    with pytest.raises(TypeError, match="^q must be a floating-point"):
        cp.ring_attention(torch.zeros(1, 2, 4, dtype=torch.int64), torch.zeros(1, 2, 4),
                          torch.zeros(1, 2, 4))
