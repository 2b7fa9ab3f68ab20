"""Tests for llmbook.scale.expert_parallel: all-to-all dispatch/combine against chapter 21's MoELayer."""

from __future__ import annotations

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded import gen

from llmbook.scale import expert_parallel as ep
from llmbook.scale.launch import run
from llmbook.scale.moe import MoELayer, all_to_all_bytes, capacity_keep_mask

pytestmark = pytest.mark.usefixtures("one_thread")
f64 = torch.float64


def _layer(d=6, f=5, n_experts=4, k=2, seed=0, **kw) -> MoELayer:
    torch.manual_seed(seed)
    return MoELayer(d, f, n_experts, k, dtype=f64, **kw)


def _batch(n, d, seed=1):
    return (torch.randn(n, d, generator=gen(seed), dtype=f64),
            torch.randn(n, d, generator=gen(seed + 1), dtype=f64))


# ---------------------------------------------------------------- bookkeeping, no processes


def test_token_chunks_and_owners_worked_example() -> None:
    assert ep.token_chunks(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert ep.token_chunks(4, 2) == [slice(0, 2), slice(2, 4)]
    assert ep.rank_of_expert(6, 3).tolist() == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="must divide num_experts"):
        ep.rank_of_expert(6, 4)


def test_assignment_counts_worked_example() -> None:
    idx = torch.tensor([[0, 2], [2, 1], [0, 1]])
    assert ep.assignment_counts(idx, 3).tolist() == [[2, 0, 1], [0, 2, 1]]


def test_keep_mask_across_ranks_worked_example() -> None:
    # 4 tokens, 2 ranks, 2 experts, top-1, capacity 1: only the first token for each expert
    idx = torch.tensor([[1], [1], [0], [1]])
    counts = torch.stack([ep.assignment_counts(idx[:2], 2), ep.assignment_counts(idx[2:], 2)])
    assert ep.keep_mask_across_ranks(idx[:2], counts, 0, 1).tolist() == [[True], [False]]
    assert ep.keep_mask_across_ranks(idx[2:], counts, 1, 1).tolist() == [[True], [False]]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 14), p=st.integers(1, 4), n_experts=st.integers(2, 6), k=st.integers(1, 2),
       cap=st.integers(0, 6), seed=st.integers(0, 10_000))
def test_keep_mask_across_ranks_equals_whole_batch_rule(n, p, n_experts, k, cap, seed) -> None:
    scores = torch.rand(n, n_experts, generator=gen(seed))
    idx = scores.topk(k, dim=-1).indices  # (n, k) distinct experts per token
    chunks = ep.token_chunks(n, p) if n >= p else [slice(0, n)] + [slice(n, n)] * (p - 1)
    counts = torch.stack([ep.assignment_counts(idx[c], n_experts) for c in chunks])
    ours = torch.cat([ep.keep_mask_across_ranks(idx[c], counts, r, cap) for r, c in enumerate(chunks)])
    assert torch.equal(ours, capacity_keep_mask(idx, n_experts, cap))


def test_remote_assignments_and_bytes_worked_example() -> None:
    # 4 tokens on 2 ranks, experts 0-1 on rank 0 and 2-3 on rank 1
    idx = torch.tensor([[0, 2], [3, 1], [2, 3], [1, 0]])
    keep = torch.tensor([[True, True], [True, False], [True, True], [True, True]])
    K = ep.remote_assignments(idx, keep, 2, 4)
    assert K.tolist() == [[1, 2], [2, 2]]
    b = ep.expert_parallel_bytes(K, 3, 4)  # 12 bytes per row
    assert b == {"dispatch": [24, 24], "combine": [24, 24], "forward": [48, 48], "step": [96, 96]}
    with pytest.raises(ValueError, match="square"):
        ep.expert_parallel_bytes(torch.zeros(2, 3), 3, 4)
    with pytest.raises(ValueError, match="keep"):
        ep.remote_assignments(idx, keep.long(), 2, 4)


def test_symbolic_bytes_against_chapter_21() -> None:
    expr = ep.expert_parallel_bytes_symbolic()
    n, k, d, b, P = sp.symbols("n k d b P", positive=True, integer=True)
    delta = sp.Symbol("delta", nonnegative=True)
    # chapter 21's forward-only all_to_all_bytes, times two for the backward pass, no drops
    for vals in ({n: 4096, k: 2, d: 4096, b: 2, P: 8}, {n: 10, k: 1, d: 6, b: 8, P: 2}):
        fwd = all_to_all_bytes(vals[n], vals[d], vals[k], vals[b], ep_size=vals[P])
        assert int(expr.subs({**vals, delta: 0})) == 2 * fwd
    assert expr.subs({n: 10, k: 2, d: 3, b: 4, P: 2, delta: sp.Rational(1, 4)}) == 360  # 4 * 20 * 3/4 * 12 * 1/2
    assert expr.subs(P, 1) == 0


def test_counter() -> None:
    c = ep.AllToAllCounter()
    c.record("dispatch forward", 3, 4, 8)
    c.record("combine forward", 1, 4, 8)
    assert c.bytes_sent() == 128 and c.bytes_sent("dispatch") == 96


def test_bad_input() -> None:
    layer = _layer()
    with pytest.raises(TypeError, match="MoELayer"):
        ep.ExpertParallelMoE(torch.nn.Linear(2, 2), 0, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity_scope"):
        ep.ExpertParallelMoE(layer, 0, 2, capacity_scope="both")
    with pytest.raises(ValueError, match="rank"):
        ep.ExpertParallelMoE(layer, 2, 2)
    with pytest.raises(ValueError, match="must divide"):
        ep.ExpertParallelMoE(layer, 0, 3)
    x, g = _batch(5, 6)
    with pytest.raises(ValueError, match="grad_out"):
        ep.single_process_reference(layer, x, g[:4])
    with pytest.raises(TypeError, match="floating"):
        ep.single_process_reference(layer, x.long(), g)
    idx = torch.tensor([[0, 1]])
    counts = ep.assignment_counts(idx, 4)[None]
    with pytest.raises(ValueError, match="capacity"):
        ep.keep_mask_across_ranks(idx, counts, 0, -1)
    with pytest.raises(ValueError, match="does not match"):
        ep.keep_mask_across_ranks(torch.tensor([[2, 3]]), counts, 0, 1)
    with pytest.raises(ValueError, match="counts"):
        ep.keep_mask_across_ranks(idx, counts[0], 0, 1)
    with pytest.raises(TypeError, match="indices"):
        ep.assignment_counts(torch.zeros(2, 2), 4)
    with pytest.raises(ValueError, match="at least one rank"):
        ep.gather_expert_grads([])


# ---------------------------------------------------------------- real processes (gloo)


def _compare(layer, x, g, world_size, scope="global"):
    out, xg, grads, keep = ep.single_process_reference(layer, x, g)
    res = run(ep.run_expert_parallel_layer, world_size, layer, x, g, scope, timeout=60)
    full = ep.gather_expert_grads(res)
    return out, xg, grads, keep, res, full


@pytest.mark.parametrize("world_size,n_experts,cf", [(2, 4, None), (2, 4, 0.75), (4, 8, 1.0)])
def test_expert_parallel_equals_single_process(world_size, n_experts, cf) -> None:
    layer = _layer(d=6, f=5, n_experts=n_experts, k=2, capacity_factor=cf,
                   shared_d_ff=3 if cf is None else None)
    x, g = _batch(13, 6)
    out, xg, grads, keep, res, full = _compare(layer, x, g, world_size)
    assert (torch.cat([r["out"] for r in res]) - out).abs().max() < 1e-14  # float64 round-off
    assert (torch.cat([r["x_grad"] for r in res]) - xg).abs().max() < 1e-14
    assert torch.equal(torch.cat([r["keep"] for r in res]), keep)
    if cf is not None:
        assert not keep.all()  # some tokens were dropped: the rule was exercised
    assert full.keys() == grads.keys()
    for name in grads:
        assert (full[name] - grads[name]).abs().max() < 1e-13, name
    # bytes: the counters of the ranks against the formula from the single-process routing
    K = ep.remote_assignments(layer.expert_indices, keep, world_size, n_experts)
    want = ep.expert_parallel_bytes(K, 6, 8)
    for r, result in enumerate(res):
        c = ep.AllToAllCounter(result["calls"])
        assert c.bytes_sent("dispatch forward") == want["dispatch"][r]
        assert c.bytes_sent("combine forward") == want["combine"][r]
        assert c.bytes_sent("dispatch") + c.bytes_sent("combine") == want["step"][r]


def test_local_capacity_equals_layer_per_rank() -> None:
    layer = _layer(d=5, f=7, n_experts=4, k=2, capacity_factor=0.75, seed=3)
    x, g = _batch(12, 5, seed=5)
    res = run(ep.run_expert_parallel_layer, 2, layer, x, g, "local", timeout=60)
    for r, rows in enumerate(ep.token_chunks(12, 2)):
        out, xg, _, keep = ep.single_process_reference(layer, x[rows], g[rows])
        assert (res[r]["out"] - out).abs().max() < 1e-14
        assert (res[r]["x_grad"] - xg).abs().max() < 1e-14
        assert torch.equal(res[r]["keep"], keep)
    _, _, _, keep_global = ep.single_process_reference(layer, x, g)
    assert not torch.equal(torch.cat([r["keep"] for r in res]), keep_global)  # the scopes differ


def test_expert_parallel_equals_transformers_mixtral() -> None:
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    from llmbook.scale.moe import from_hf_moe_block

    cfg = MixtralConfig(hidden_size=6, intermediate_size=10, num_local_experts=4, num_experts_per_tok=2)
    hf = MixtralSparseMoeBlock(cfg).double().eval()
    with torch.no_grad():
        for i, param in enumerate(hf.parameters()):
            param.copy_(0.3 * torch.randn(param.shape, generator=gen(i), dtype=f64))
    layer = from_hf_moe_block(hf, cfg)
    x, g = _batch(10, 6, seed=7)
    res = run(ep.run_expert_parallel_layer, 2, layer, x, g, timeout=60)
    with torch.no_grad():
        y_hf = hf(x[None])[0]
    y_hf = y_hf[0] if isinstance(y_hf, tuple) else y_hf
    assert (torch.cat([r["out"] for r in res]) - y_hf).abs().max() < 1e-6  # HF's softmax in float32
