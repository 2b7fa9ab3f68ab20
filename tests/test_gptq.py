"""Tests for llmbook.inference.gptq: the OBS update, GPTQ (naive and Cholesky), AWQ, whole models."""

import copy

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.inference.gptq import (
    awq_scale_model,
    awq_scale_search,
    gptq_lstsq_reference,
    gptq_quantize,
    gptq_quantize_naive,
    hessian_from_inputs,
    layer_output_error,
    model_memory_bytes,
    quantize_brute_force,
    quantize_model,
    quantize_rtn,
)
from llmbook.text.data import default_source
from llmbook.training.pretrained import RECIPES, book_model
from llmbook.training.train import evaluate, get_batch
from llmbook.transformer.model import TransformerConfig, TransformerLM

f64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def correlated_inputs(n: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g, dtype=f64) / d**0.5 + torch.eye(d, dtype=f64)
    return torch.randn(n, d, generator=g, dtype=f64) @ mix  # (n, d), correlated columns


def test_obs_update_derived_with_lagrange():
    """min ½ δᵀHδ s.t. e_qᵀδ + w_q = c: δ = -(w_q - c) H⁻¹e_q / [H⁻¹]_qq,
    loss (w_q - c)² / (2 [H⁻¹]_qq)."""
    a, b, c_, e, f, h = sp.symbols("a b c e f h", real=True)
    H = sp.Matrix([[a, b, c_], [b, e, f], [c_, f, h]])
    d = sp.Matrix(sp.symbols("d0:3", real=True))
    lam, wq, target = sp.symbols("lambda w_q c", real=True)
    q = 1
    lagrangian = (d.T * H * d)[0] / 2 + lam * (d[q] + wq - target)
    sol = sp.solve([sp.diff(lagrangian, v) for v in [*d, lam]], [*d, lam], dict=True)[0]
    Hinv = H.inv()
    closed = -(wq - target) / Hinv[q, q] * Hinv[:, q]
    for i in range(3):
        assert sp.simplify(sol[d[i]] - closed[i]) == 0
    loss = (sp.Matrix([sol[v] for v in d]).T * H * sp.Matrix([sol[v] for v in d]))[0] / 2
    assert sp.simplify(loss - (wq - target) ** 2 / (2 * Hinv[q, q])) == 0


def test_single_obs_step_matches_first_gptq_column():
    X = correlated_inputs(200, 6)
    H = hessian_from_inputs(X)
    W = torch.randn(1, 6, generator=torch.Generator().manual_seed(3), dtype=f64)
    Q, _ = gptq_quantize_naive(W, H, 3, damp=0.0)
    # the first column is quantised on the row's grid, then w_1.. move by the OBS update
    w0_hat = Q[0, 0]
    Hinv = torch.linalg.inv(H)
    delta = -(W[0, 0] - w0_hat) / Hinv[0, 0] * Hinv[:, 0]
    w_after = W[0] + delta
    assert abs(float(w_after[0] - w0_hat)) < 1e-12
    # the next column is the rounding of the updated value
    grid_scale = (W.max().clamp(min=0) - W.min().clamp(max=0)) / 7
    zero = torch.round(-W.min().clamp(max=0) / grid_scale)
    expected = grid_scale * (torch.clamp(torch.round(w_after[1] / grid_scale) + zero, 0, 7) - zero)
    assert float((Q[0, 1] - expected).abs()) < 1e-12


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 1000), bits=st.sampled_from([2, 3, 4]),
       group=st.sampled_from([None, 8, 16]), block=st.sampled_from([16, 32, 128]))
def test_cholesky_gptq_equals_naive(seed, bits, group, block):
    X = correlated_inputs(300, 32, seed)
    W = torch.randn(10, 32, generator=torch.Generator().manual_seed(seed + 1), dtype=f64)
    H = hessian_from_inputs(X)
    a, sa = gptq_quantize(W, H, bits, group, block_size=block)
    b, sb = gptq_quantize_naive(W, H, bits, group)
    assert float((a - b).abs().max()) < 1e-6
    assert sa["loss"] == pytest.approx(sb["loss"], rel=1e-6)


def test_gptq_beats_rtn_on_layer_output():
    X = correlated_inputs(512, 48)
    W = torch.randn(24, 48, generator=torch.Generator().manual_seed(5), dtype=f64)
    H = hessian_from_inputs(X)
    for bits, group in [(4, None), (3, 16), (2, 16)]:
        Wg, stats = gptq_quantize(W, H, bits, group)
        err_g = layer_output_error(W, Wg, X)
        err_r = layer_output_error(W, quantize_rtn(W, bits, group), X)
        assert err_g < 0.9 * err_r, (bits, group, err_g, err_r)
        # GPTQ's OBS losses add up to the quadratic it minimises, ½ tr(E H_λ Eᵀ) with E = W - Ŵ
        # and H_λ = 2 XᵀX + λI, λ = damp · mean(diag H): ‖X Eᵀ‖² + ½ λ ‖E‖², exactly
        lam = 0.01 * float(torch.diag(H).mean())
        assert stats["loss"] == pytest.approx(err_g**2 + 0.5 * lam * float(((W - Wg) ** 2).sum()), rel=1e-10)
        W0, undamped = gptq_quantize(W, H, bits, group, damp=0.0)
        assert undamped["loss"] == pytest.approx(layer_output_error(W, W0, X) ** 2, rel=1e-10)
    # GPTQ's output is on the quantisation grid: at most 2^b distinct values per group
    Wg, _ = gptq_quantize(W, H, 3, 16)
    for j in range(0, 48, 16):
        assert all(len(set(row.tolist())) <= 8 for row in Wg[:, j:j + 16])


def test_gptq_handles_dead_inputs_and_float32():
    X = correlated_inputs(100, 8)
    X[:, 3] = 0  # an input that is always zero
    W = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    Q, _ = gptq_quantize(W, hessian_from_inputs(X).float(), 4)
    assert Q.dtype == torch.float32 and torch.isfinite(Q).all()
    assert (Q[:, 3] == 0).all()


def test_awq_finds_outlier_channels():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(512, 64, generator=g, dtype=f64)
    X[:, :4] *= 30.0  # a few salient input channels
    W = torch.randn(32, 64, generator=g, dtype=f64)
    W_hat, stats = awq_scale_search(W, X, 3, 32)
    err_awq = layer_output_error(W, W_hat, X)
    err_rtn = layer_output_error(W, quantize_rtn(W, 3, 32), X)
    assert stats["alpha"] > 0 and err_awq < 0.8 * err_rtn
    assert stats["errors"][0] == pytest.approx(err_rtn, rel=1e-9)  # α = 0 is RTN
    assert min(stats["errors"]) == pytest.approx(err_awq, rel=1e-9)
    s = stats["scales"]
    assert s.shape == (64,) and float(s[:4].min()) > float(s[4:].max())
    assert float(s.max() * s.min()) == pytest.approx(1.0)


def small_model() -> TransformerLM:
    cfg = TransformerConfig.gpt2_style(vocab_size=16, d_model=32, n_layers=2, n_heads=2,
                                       max_seq_len=16, activation="gelu")
    return TransformerLM(cfg, generator=torch.Generator().manual_seed(0)).eval()


def test_quantize_model_rtn_gptq_awq():
    model = small_model()
    tokens = default_source().sample(4000, seed=0)
    calib, _ = get_batch(tokens, 32, 16, "cpu", torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for method in ["rtn", "gptq", "awq"]:
        q = quantize_model(model, method, 4, 16, calib)
        for name, p in q.named_parameters():
            if name.startswith("blocks.") and name.endswith("weight") and p.ndim == 2:
                assert not torch.equal(p, before[name])
                if method == "awq" and name.endswith("mlp.proj.weight"):
                    continue  # explicit input scale: on the grid only after multiplying by s
                for j in range(0, p.shape[1], 16):  # at most 16 values per row and group
                    assert max(len(set(r.tolist())) for r in p[:, j:j + 16]) <= 16
            elif method == "awq" and any(k in name for k in ("attn_norm", "mlp_norm", "v_proj.bias")):
                continue  # 1/s may be folded in here (tested in the AWQ tests below)
            else:
                assert torch.equal(p, before[name]), name
    rtn = quantize_model(model, "rtn", 4, 16)
    w = model.blocks[0].mlp.fc.weight.detach()
    torch.testing.assert_close(rtn.blocks[0].mlp.fc.weight.detach(), quantize_rtn(w, 4, 16))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # unchanged
    loss = evaluate(quantize_model(model, "gptq", 8, None, calib), tokens, 8, 16, 2)
    assert loss == pytest.approx(evaluate(model, tokens, 8, 16, 2), abs=1e-3)


def test_gptq_beats_rtn_on_the_book_model():
    """On the book's synthetic model (trained once and cached), GPTQ's loss increase at
    4 and 3 bits (groups of 32) is smaller than round-to-nearest's."""
    model, info = book_model("synthetic")
    d = RECIPES["synthetic"]["data"]
    train_tokens, val_tokens = default_source().train_val(d["num_train"], d["num_val"],
                                                          seed=d["seed"])
    calib, _ = get_batch(train_tokens, 256, 16, "cpu", torch.Generator().manual_seed(0))

    def loss(m):
        return evaluate(m, val_tokens, 256, 16, 4, torch.Generator().manual_seed(1234),
                        first_position=info["val_first_position"])

    base = loss(model)
    for bits in (4, 3):
        rtn = loss(quantize_model(model, "rtn", bits, 32)) - base
        gptq = loss(quantize_model(model, "gptq", bits, 32, calib)) - base
        assert 0 <= gptq < rtn, (bits, gptq, rtn)


def test_downdate_is_the_inverse_of_the_reduced_matrix():
    """(H⁻¹ - H⁻¹[:, q] H⁻¹[q, :] / [H⁻¹]_qq) without row and column q = (H without q)⁻¹,
    on a non-trivial SPD matrix in float64, for every q."""
    X = correlated_inputs(40, 7, seed=2)
    H = hessian_from_inputs(X)
    Hinv = torch.linalg.inv(H)
    for q in range(7):
        keep = [i for i in range(7) if i != q]
        down = (Hinv - Hinv[:, q:q + 1] @ Hinv[q:q + 1, :] / Hinv[q, q])[keep][:, keep]
        torch.testing.assert_close(down, torch.linalg.inv(H[keep][:, keep]), rtol=1e-10,
                                   atol=1e-12)
        assert float(down[:, :].abs().max()) > 0 and float(Hinv[q, q]) > 0


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), bits=st.sampled_from([2, 3, 4]),
       group=st.sampled_from([None, 4, 8]), damp=st.sampled_from([0.0, 0.01, 0.1]))
def test_gptq_equals_sequential_least_squares_on_x(seed, bits, group, damp):
    """GPTQ (Cholesky, lazy blocks) = re-solving min ‖XWᵀ - X_Q Ŵ_Qᵀ - X_F W_Fᵀ‖ with lstsq
    after every column: no H and no H⁻¹ on the reference side; damping as ridge rows."""
    X = correlated_inputs(100, 16, seed)
    W = torch.randn(5, 16, generator=torch.Generator().manual_seed(seed + 7), dtype=f64)
    ref = gptq_lstsq_reference(W, X, bits, group, damp=damp)
    got, _ = gptq_quantize(W, hessian_from_inputs(X), bits, group, block_size=8, damp=damp)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)
    # and not trivially: the result differs from round-to-nearest
    assert not torch.equal(ref, quantize_rtn(W, bits, group))


def test_lstsq_reference_first_column_is_the_obs_update():
    """After rounding column 0 the reference's free columns are w_F - (w_0 - ŵ_0) H⁻¹[F, 0] /
    [H⁻¹]_00 (the OBS step), checked on one step with two columns where it is by hand:
    for H = [[a, b], [b, c]], H⁻¹[1, 0] / H⁻¹[0, 0] = -b / c."""
    X = torch.tensor([[1.0, 0.5], [0.0, 1.0], [1.0, 1.0]], dtype=f64)  # XᵀX = [[2, 1.5], [1.5, 2.25]]
    W = torch.tensor([[0.3, -0.2]], dtype=f64)
    Q = gptq_lstsq_reference(W, X, 2)
    scale = 0.5 / 3  # zero-point grid of the row: range [-0.2, 0.3] in 3 steps
    w0_hat = scale * round(0.3 / scale)  # zero point round(0.2 / scale) = 1 cancels
    w1 = -0.2 + (0.3 - w0_hat) * 1.5 / 2.25  # -(w0 - ŵ0) · (-b / c)
    zero = round(0.2 / scale)
    expected1 = scale * (min(max(round(w1 / scale) + zero, 0), 3) - zero)
    assert float(Q[0, 0]) == pytest.approx(w0_hat, abs=1e-15)
    assert float(Q[0, 1]) == pytest.approx(expected1, abs=1e-15)


def test_brute_force_worked_example_and_separable_case():
    """With H = I the problem separates per weight, so the optimum is round-to-nearest."""
    W = torch.tensor([[0.9, -0.4, 0.25, 0.0, -0.1]], dtype=f64)
    torch.testing.assert_close(quantize_brute_force(W, torch.eye(5, dtype=f64), 2),
                               quantize_rtn(W, 2), rtol=0, atol=1e-15)
    # a correlated 2 x 2 case, against all 16 grid points enumerated here directly
    H = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=f64)
    w = torch.tensor([[1.0, 0.45]], dtype=f64)  # grid step 1/3: RTN gives (1, 1/3)
    best = quantize_brute_force(w, H, 2)
    loss = lambda v: float((w - v) @ H @ (w - v).T)  # noqa: E731
    assert loss(best) <= loss(quantize_rtn(w, 2)) + 1e-15
    grid = [k / 3 for k in range(4)]
    assert loss(best) == pytest.approx(min(loss(torch.tensor([[a, b]], dtype=f64))
                                           for a in grid for b in grid), abs=1e-15)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), bits=st.sampled_from([2, 3]),
       d_in=st.integers(2, 5))
def test_brute_force_is_a_lower_bound_for_rtn_and_gptq(seed, bits, d_in):
    X = correlated_inputs(30, d_in, seed)
    W = torch.randn(3, d_in, generator=torch.Generator().manual_seed(seed), dtype=f64)
    H = hessian_from_inputs(X)
    opt = layer_output_error(W, quantize_brute_force(W, H, bits), X)
    for W_hat in (quantize_rtn(W, bits), gptq_quantize(W, H, bits)[0]):
        assert opt <= layer_output_error(W, W_hat, X) * (1 + 1e-12)


def test_gptq_lands_between_rtn_and_the_optimum_on_a_fixed_problem():
    g = torch.Generator().manual_seed(15)
    X = torch.randn(64, 6, generator=g, dtype=f64) @ (torch.randn(6, 6, generator=g, dtype=f64)
                                                     + 2 * torch.eye(6, dtype=f64))
    w = torch.randn(1, 6, generator=g, dtype=f64)
    H = hessian_from_inputs(X)
    e_opt = layer_output_error(w, quantize_brute_force(w, H, 2), X)
    e_gptq = layer_output_error(w, gptq_quantize(w, H, 2, damp=0.0)[0], X)
    e_rtn = layer_output_error(w, quantize_rtn(w, 2), X)
    assert e_opt <= e_gptq <= e_rtn and e_opt < e_rtn


def test_awq_scale_model_folds_without_changing_the_float_model():
    model = small_model()
    tokens = default_source().sample(2000, seed=1)
    calib, _ = get_batch(tokens, 16, 16, "cpu", torch.Generator().manual_seed(0))
    scaled, records = awq_scale_model(model, 3, 16, calib, grid=5)
    m64 = copy.deepcopy(model).to(f64)
    torch.testing.assert_close(scaled(calib), m64(calib), rtol=0, atol=1e-12)
    assert [r["group"] for r in records] == ["q/k/v", "o_proj", "fc", "proj"] * 2
    for r in records:
        b = r["block"]
        s = r["scales"]
        assert len(r["errors"]) == 6 and min(r["errors"]) <= r["errors"][0]
        assert float(s.max() * s.min()) == pytest.approx(1.0)
        if r["group"] == "q/k/v":  # one shared scale: the norm's gain divided, q/k/v's columns multiplied
            torch.testing.assert_close(scaled.blocks[b].attn_norm.weight * s,
                                       m64.blocks[b].attn_norm.weight, rtol=1e-14, atol=0)
            for name in ("q_proj", "k_proj", "v_proj") if r["alpha"] > 0 else ():
                w_new = getattr(scaled.blocks[b].attn, name).weight
                w_old = getattr(m64.blocks[b].attn, name).weight
                if name != "v_proj":
                    torch.testing.assert_close(w_new, w_old * s, rtol=1e-14, atol=0)
        if r["group"] == "proj":
            assert r["folded_into"] is None
            torch.testing.assert_close(scaled.blocks[b].mlp.proj.weight, m64.blocks[b].mlp.proj.weight,
                                       rtol=0, atol=0)
    assert any(r["alpha"] > 0 for r in records)  # the search does move away from RTN


def test_awq_scale_model_swiglu_and_grouped_query_attention():
    """SwiGLU: down_proj's scale folds into up_proj. GQA: o_proj's scale cannot fold into v_proj."""
    cfg = TransformerConfig.llama_style(vocab_size=16, d_model=32, n_layers=1, n_heads=4,
                                        n_kv_heads=2, max_seq_len=16)
    model = TransformerLM(cfg, generator=torch.Generator().manual_seed(0)).eval()
    calib, _ = get_batch(default_source().sample(2000, seed=2), 8, 16, "cpu",
                         torch.Generator().manual_seed(0))
    scaled, records = awq_scale_model(model, 3, 16, calib, grid=4)
    torch.testing.assert_close(scaled(calib), copy.deepcopy(model).to(f64)(calib), rtol=0,
                               atol=1e-12)
    by_group = {r["group"]: r for r in records}
    assert by_group["o_proj"]["folded_into"] is None
    assert by_group["down_proj"]["folded_into"] == "blocks.0.mlp.up_proj"
    assert by_group["gate/up"]["folded_into"] == "blocks.0.mlp_norm"
    q = quantize_model(model, "awq", 4, 16, calib, grid=4)
    assert q.blocks[0].attn.q_proj.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="calib_ids"):
        awq_scale_model(model, 3, 16, calib[0])
    with pytest.raises(ValueError, match="grid"):
        awq_scale_model(model, 3, 16, calib, grid=0)


def test_model_memory_bytes():
    model = small_model()
    n_all = model.num_parameters()
    assert model_memory_bytes(model) == 2 * n_all
    lin = [m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    n_lin = sum(w.numel() for w in lin)
    rows = sum(w.shape[0] for w in lin)
    groups = sum(w.shape[0] * w.shape[1] // 16 for w in lin)
    expected4 = (16 * (n_all - n_lin) + 4 * n_lin + rows * (16 + 4) + 7) // 8
    assert model_memory_bytes(model, 4) == expected4
    assert model_memory_bytes(model, 4, 16) == (16 * (n_all - n_lin) + 4 * n_lin
                                                + groups * 20 + 7) // 8
    assert model_memory_bytes(model, 3, 16) < model_memory_bytes(model, 4, 16) < \
        model_memory_bytes(model, 8, 16) < model_memory_bytes(model)
    with pytest.raises(ValueError, match="group_size=5"):
        model_memory_bytes(model, 4, 5)


def test_validation():
    W, H = torch.randn(4, 8, dtype=f64), torch.eye(8, dtype=f64)
    with pytest.raises(ValueError, match="H must have shape"):
        gptq_quantize(W, torch.eye(6, dtype=f64), 4)
    with pytest.raises(ValueError, match="bits"):
        gptq_quantize(W, H, 9)
    with pytest.raises(ValueError, match="group_size"):
        gptq_quantize(W, H, 4, 3)
    with pytest.raises(ValueError, match="multiple of group_size"):
        gptq_quantize(W, H, 4, 8, block_size=4)
    with pytest.raises(ValueError, match="damp"):
        gptq_quantize_naive(W, H, 4, damp=-1.0)
    indefinite = torch.diag(torch.tensor([1.0, -4.0] + [1.0] * (H.shape[0] - 2)))
    for fn in (gptq_quantize_naive, gptq_quantize):
        with pytest.raises(ValueError, match="not positive definite even after damping"):
            fn(W, indefinite, 4)
    with pytest.raises(ValueError, match="W must be a 2-D"):
        quantize_rtn(torch.randn(8), 4)
    with pytest.raises(ValueError, match="X must have shape"):
        awq_scale_search(W, torch.randn(10, 5, dtype=f64), 4)
    with pytest.raises(ValueError, match="method"):
        quantize_model(small_model(), "fp4", 4)
    with pytest.raises(ValueError, match="calib_ids"):
        quantize_model(small_model(), "gptq", 4)
    with pytest.raises(ValueError, match="X must be 2-D"):
        hessian_from_inputs(torch.randn(3))
    with pytest.raises(ValueError, match="X must have shape"):
        gptq_lstsq_reference(W, torch.randn(10, 5, dtype=f64), 4)
    with pytest.raises(ValueError, match="damp"):
        gptq_lstsq_reference(W, torch.randn(10, 8, dtype=f64), 4, damp=1.5)
    with pytest.raises(ValueError, match="too many"):
        quantize_brute_force(W, H, 4)  # 4 bits x 8 columns = 2^32 codes per row
    with pytest.raises(ValueError, match="H must have shape"):
        quantize_brute_force(W[:, :4], H, 2)
