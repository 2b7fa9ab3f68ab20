"""Tests for llmbook.scale.tensor_parallel: Megatron's f/g, column/row layers, MLP and attention."""

from __future__ import annotations

from fractions import Fraction

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen
from torch import nn

from llmbook.scale import tensor_parallel as tp
from llmbook.scale.collectives import ring_all_reduce_bytes_per_rank
from llmbook.scale.launch import run
from llmbook.transformer.attention import MultiHeadAttention
from llmbook.transformer.layers import MLP

pytestmark = pytest.mark.usefixtures("one_thread")
f64 = torch.float64


def test_ring_allreduce_bytes_worked_example() -> None:
    # 2 (p-1)/p n b: p = 4, n = 10, 4 bytes -> 60
    assert ring_all_reduce_bytes_per_rank(10, 4, 4) == 60
    assert ring_all_reduce_bytes_per_rank(10, 3, 2) == Fraction(80, 3)
    assert ring_all_reduce_bytes_per_rank(7, 1) == 0
    with pytest.raises(ValueError, match="world_size"):
        ring_all_reduce_bytes_per_rank(10, 0)


def test_symbolic_formulas() -> None:
    B, T, d, p, b = sp.symbols("B T d p b", positive=True, integer=True)
    per = tp.activation_all_reduce_bytes_symbolic()
    assert sp.simplify(per - 2 * (p - 1) / p * B * T * d * b) == 0
    comm = tp.tp_block_comm_symbolic()
    assert comm["allreduces_block"] == comm["allreduces_mlp"] + comm["allreduces_attention"] == 4
    assert sp.simplify(comm["block"] - 4 * per) == 0
    assert comm["mlp"].subs({B: 3, T: 5, d: 12, p: 2, b: 8}) == 2 * 180 * 8


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 10_000), p=st.integers(1, 64), b=st.sampled_from([1, 2, 4, 8]))
def test_ring_bytes_match_symbolic(n: int, p: int, b: int) -> None:
    s = {sp.Symbol(k, positive=True, integer=True): v for k, v in
         {"B": n, "T": 1, "d": 1, "p": p, "b": b}.items()}
    assert sp.Rational(ring_all_reduce_bytes_per_rank(n, p, b)) == tp.activation_all_reduce_bytes_symbolic().subs(s)


def test_counter_records_and_sums() -> None:
    c = tp.CommCounter()
    x = torch.zeros(3, 4, dtype=f64, requires_grad=True)
    y = tp.reduce_from_parallel_region(tp.copy_to_parallel_region(x, c), c)
    assert c.calls == [("g forward", 12, 8)]
    y.sum().backward()
    assert c.calls == [("g forward", 12, 8), ("f backward", 12, 8)]
    assert c.n_calls == 2 and c.elements == 24
    assert c.ring_bytes_per_rank(4) == 2 * Fraction(2 * 3 * 12 * 8, 4)
    c.reset()
    assert c.n_calls == 0


def test_f_and_g_are_identities_in_one_process() -> None:
    x = torch.randn(2, 3, generator=gen(0), dtype=f64, requires_grad=True)
    for op in (tp.copy_to_parallel_region, tp.reduce_from_parallel_region):
        y = op(x)
        assert torch.equal(y, x)
        (g,) = torch.autograd.grad((y * 2).sum(), x)
        assert torch.equal(g, torch.full_like(x, 2.0))


def test_shard_range_and_bad_world_sizes() -> None:
    assert tp.shard_range(12, 1, 3) == slice(4, 8)
    with pytest.raises(ValueError, match="does not divide"):
        tp.shard_range(10, 0, 3)
    with pytest.raises(ValueError, match="rank"):
        tp.shard_range(12, 3, 3)


def test_column_and_row_shards_sum_to_the_full_layer_in_one_process() -> None:
    """Without processes: the shards' outputs, concatenated or summed, give the full layer."""
    torch.manual_seed(0)
    fc, proj = nn.Linear(5, 6, dtype=f64), nn.Linear(6, 7, dtype=f64)
    x = torch.randn(4, 5, generator=gen(1), dtype=f64)
    cols = [tp.ColumnParallelLinear.from_linear(fc, r, 3)(x) for r in range(3)]
    assert torch.allclose(torch.cat(cols, -1), fc(x), atol=1e-14)
    h = fc(x)
    parts = [tp.RowParallelLinear.from_linear(proj, r, 2) for r in range(2)]
    partial = sum(nn.functional.linear(h[:, r * 3:(r + 1) * 3], parts[r].weight) for r in range(2))
    assert torch.allclose(partial + proj.bias, proj(h), atol=1e-14)
    assert parts[0](h[:, :3]).shape == (4, 7)  # one process: g is the identity
    with pytest.raises(ValueError, match="last dimension"):
        parts[0](h)
    with pytest.raises(ValueError, match="does not divide"):
        tp.ColumnParallelLinear.from_linear(fc, 0, 4)


def test_bad_inputs_for_the_parallel_blocks() -> None:
    with pytest.raises(ValueError, match="n_heads"):
        tp.ParallelAttention(MultiHeadAttention(12, 3, dtype=f64), 0, 2)
    with pytest.raises(ValueError, match="n_kv_heads"):
        tp.ParallelAttention(MultiHeadAttention(12, 4, 1, dtype=f64), 0, 2)
    with pytest.raises(ValueError, match="d_ff|out_features"):
        tp.ParallelMLP(MLP(8, 10, dtype=f64), 0, 4)
    with pytest.raises(TypeError, match="MLP"):
        tp.ParallelMLP(nn.Linear(3, 3), 0, 1)
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        tp.ParallelAttention(MLP(8, 8), 0, 1)
    with pytest.raises(TypeError, match="MLP or MultiHeadAttention"):
        tp.single_process_reference(nn.Linear(3, 3), torch.zeros(1, 3), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="at least one"):
        tp.gather_sharded([])
    with pytest.raises(TypeError, match="list"):
        tp.run_tensor_parallel_layers(0, 1, [], torch.zeros(1), torch.zeros(1))


def _layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [MLP(12, 20, dtype=f64), MultiHeadAttention(12, 4, 2, bias=True, dtype=f64)]


def test_world_size_one_equals_the_layer() -> None:
    x = torch.randn(2, 3, 12, generator=gen(2), dtype=f64)
    g = torch.randn(2, 3, 12, generator=gen(3), dtype=f64)
    for layer in _layers():
        res = tp.run_tensor_parallel_layers(0, 1, [layer], x, g)
        out, xg, grads = tp.single_process_reference(layer, x, g)
        full = tp.gather_sharded(res)
        assert torch.allclose(res[0]["out"], out, atol=1e-13)
        assert torch.allclose(res[0]["x_grad"], xg, atol=1e-13)
        assert all(torch.allclose(full[k], grads[k], atol=1e-13) for k in grads)


def test_two_processes_equal_single_process_and_count_bytes() -> None:
    B, T, d = 3, 5, 12  # non-square everywhere
    x = torch.randn(B, T, d, generator=gen(4), dtype=f64)
    g = torch.randn(B, T, d, generator=gen(5), dtype=f64)
    layers = _layers()
    per_rank = run(tp.run_tensor_parallel_layers, 2, layers, x, g, timeout=30)
    for i, layer in enumerate(layers):
        res = [r[i] for r in per_rank]
        out, xg, grads = tp.single_process_reference(layer, x, g)
        full = tp.gather_sharded(res)
        assert set(full) == set(grads)
        for r in res:
            assert (r["out"] - out).abs().max() < 1e-12
            assert (r["x_grad"] - xg).abs().max() < 1e-12
            assert r["calls"] == [("g forward", B * T * d, 8), ("f backward", B * T * d, 8)]
        assert max(float((full[k] - grads[k]).abs().max()) for k in grads) < 1e-12
        s = {sp.Symbol(k, positive=True, integer=True): v for k, v in
             {"B": B, "T": T, "d": d, "p": 2, "b": 8}.items()}
        counted = tp.CommCounter(res[0]["calls"]).ring_bytes_per_rank(2)
        assert counted == tp.tp_block_comm_symbolic()["mlp"].subs(s) == 2 * B * T * d * 8


def test_gather_sharded_rejects_differing_replicas() -> None:
    a = {"grads": {"b": (torch.zeros(2), None)}}
    b = {"grads": {"b": (torch.ones(2), None)}}
    with pytest.raises(ValueError, match="differs"):
        tp.gather_sharded([a, b])
