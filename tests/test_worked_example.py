"""The published worked example ("the cat sat"): every value recomputed with llmbook, the
exact values pinned against high-precision arithmetic, and the source's printed values graded."""

import math

import mpmath
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from llmbook.inference.sampling import apply_temperature, top_k_filter, top_p_filter
from llmbook.text.functional import cross_entropy, softmax
from llmbook.text.worked_example import PublishedComparison, grade, load_the_cat_sat
from llmbook.transformer.attention import attention_weights, scaled_dot_product_attention
from llmbook.transformer.layers import LayerNorm
from llmbook.transformer.worked_example import ffn_step

mpmath.mp.dps = 40
EX = load_the_cat_sat()


def book_values() -> dict[str, torch.Tensor]:
    """Every quantity of the example, computed with the book's layers in float64."""
    inp = EX.inputs
    x = inp["E"][EX.input_ids]  # (3, 4): "the cat sat"
    q, k, v = x @ inp["W_Q"], x @ inp["W_K"], x @ inp["W_V"]  # (3, 2) each
    out = {"Q": q, "K": k, "V": v, "S": q @ k.T, "S_scaled": q @ k.T / math.sqrt(2),
           "A": attention_weights(q, k), "Z": scaled_dot_product_attention(q, k, v)}
    step = ffn_step(EX)  # chapter 6's MLP (ReLU) and LayerNorm (eps 0) on the embedding of "sat"
    x2 = inp["E"][2]
    assert torch.equal(step["x"], x2)
    out["ffn_pre_activation"], out["ffn_out"] = step["pre_activation"], step["ffn_out"]
    out["residual"], out["layernorm_out"] = step["residual"], step["h_last"]
    assert torch.equal(step["residual"], out["ffn_out"] + x2)
    out["layernorm_mean"] = out["residual"].mean()
    out["layernorm_variance"] = out["residual"].var(correction=0)
    ln = LayerNorm(4, eps=1e-300, dtype=torch.float64)  # eps 1e-300 is 0 next to 0.23 in float64
    assert torch.allclose(ln(out["residual"]), step["h_last"], rtol=0, atol=1e-15)
    out["logits"] = step["logits"]
    assert torch.allclose(out["logits"], inp["W_out"] @ ln(out["residual"]), rtol=0, atol=1e-15)
    for t in (0.5, 1.0, 2.0):
        out[f"T{t}"] = softmax(apply_temperature(out["logits"], t))
    target = torch.tensor(EX.vocabulary.index(inp["target_for_cross_entropy"]))
    out["cross_entropy_on"] = cross_entropy(out["logits"], target)
    return out


def test_inputs_load_with_their_shapes():
    shapes = {n: tuple(EX.inputs[n].shape) for n in ("E", "W_Q", "W1", "b1", "W2", "W_out")}
    assert shapes == {"E": (5, 4), "W_Q": (4, 2), "W1": (3, 4), "b1": (3,), "W2": (4, 3), "W_out": (5, 4)}
    assert EX.decimals["ffn_out"] == [3, 3, 3, 3]  # "0.200" and "-0.020" keep their printed decimals
    assert EX.decimals["top_p_0.75_cumulative"][-1] == 1
    with pytest.raises(TypeError, match="list of tokens"):
        EX.published_tensor("top_k_3_set")


def test_exact_values_against_high_precision_arithmetic():
    v = book_values()
    # Q, K, V, S are sums of products of one-decimal numbers: exact to two and four decimals
    assert v["Q"].flatten().tolist() == pytest.approx([0.34, 0.35, 0.23, -0.09, -0.52, 0.78], abs=1e-15)
    assert v["S"][2].tolist() == pytest.approx([0.4134, -0.4472, 0.3848], abs=1e-15)
    assert v["ffn_out"].tolist() == pytest.approx([0.082, 0.092, 0.2, -0.02], abs=1e-15)
    assert v["layernorm_mean"].item() == pytest.approx(0.1385, abs=1e-15)
    assert v["layernorm_variance"].item() == pytest.approx(0.23361475, abs=1e-15)
    # softmax, square root and logarithm: against mpmath at 40 digits, from the exact S
    S = [[mpmath.mpf(str(round(s, 4))) for s in row] for row in v["S"].tolist()]
    for i, row in enumerate(S):
        e = [mpmath.exp(s / mpmath.sqrt(2)) for s in row]
        assert v["A"][i].tolist() == pytest.approx([float(x / sum(e)) for x in e], abs=2e-16)
    assert round(v["A"][2, 0].item(), 8) == 0.39617662  # printed 0.3963
    y = [mpmath.mpf(s) for s in ("-0.218", "0.792", "0.4", "-0.42")]
    mu = sum(y) / 4
    sd = mpmath.sqrt(sum((t - mu) ** 2 for t in y) / 4)
    h = [(t - mu) / sd for t in y]
    W = [[mpmath.mpf(str(w)) for w in row] for row in EX.inputs["W_out"].tolist()]
    z = [sum(a * b for a, b in zip(row, h, strict=True)) for row in W]
    assert v["logits"].tolist() == pytest.approx([float(t) for t in z], abs=1e-15)
    ce = mpmath.log(sum(mpmath.exp(t) for t in z)) - z[3]
    assert v["cross_entropy_on"].item() == pytest.approx(float(ce), abs=1e-15)
    assert round(float(ce), 6) == 1.745461  # the source printed 1.7454: cut, not rounded
    for t in (0.5, 1.0, 2.0):
        e = [mpmath.exp(x / t) for x in z]
        assert v[f"T{t}"].tolist() == pytest.approx([float(x / sum(e)) for x in e], abs=2e-16)


def test_sampling_sets():
    z = book_values()["logits"]
    kept_k = torch.isfinite(top_k_filter(z, 3)).nonzero().flatten().tolist()
    assert {EX.vocabulary[i] for i in kept_k} == {"mat", "cat", "sat"}
    kept_p = torch.isfinite(top_p_filter(z, 0.75)).nonzero().flatten().tolist()
    assert [EX.vocabulary[i] for i in kept_p] == ["cat", "sat", "on", "mat"]  # four, not three
    # by the source's own cumulative sums as well: 0.7004 < 0.75 <= 0.8748
    cum = EX.published["top_p_0.75_cumulative"]
    assert next(i for i, c in enumerate(cum) if c >= 0.75) + 1 == 4


def test_the_sources_errors_are_found():
    v = book_values()
    pub = EX.published_tensor
    table = PublishedComparison("the cat sat")
    for name in ("Q", "K", "V", "S", "ffn_pre_activation", "ffn_out", "residual"):
        assert set(table.add(name, EX.published[name], v[name])) == {"agrees"}, name
    table.add("S_scaled", EX.published["S_scaled"], v["S_scaled"], from_rounded=pub("S") / math.sqrt(2))
    table.add("A", EX.published["A"], v["A"], from_rounded=torch.softmax(pub("S_scaled"), -1))
    table.add("Z", EX.published["Z"], v["Z"], from_rounded=pub("A") @ pub("V"))
    rows = {n: table.add(f"probabilities_{n}", EX.published[f"probabilities_{n}"], v[f"T{t}"],
                         from_rounded=torch.softmax(pub("logits") / t, -1))
            for n, t in (("T0.5", 0.5), ("T1", 1.0), ("T2", 2.0))}
    # the T = 0.5 row is wrong by far more than rounding (it sums to 0.8725), the others are not
    assert rows["T0.5"].count("error") >= 4
    assert sum(EX.published["probabilities_T0.5"]) == pytest.approx(0.8725, abs=1e-12)
    assert "error" not in rows["T1"] + rows["T2"]
    assert rows["T2"][1] == "last digit"  # 0.2148 for 0.21458 (0.21468 from the rounded logits)
    verdict = table.add("cross_entropy_on", EX.published["cross_entropy_on"], v["cross_entropy_on"])
    assert verdict == ["truncated"]
    assert table.add("nucleus", EX.published["top_p_0.75_nucleus_claimed"],
                     ["mat", "cat", "sat", "on"], as_set=True) == ["error"]
    assert table.add("top-k", EX.published["top_k_3_set"], ["sat", "mat", "cat"], as_set=True) == ["agrees"]
    assert table.add("p = 0.99", EX.published["cross_entropy_if_p_0.99"], -math.log(0.99)) == ["agrees"]
    text = repr(table)
    assert text.startswith("the cat sat: ") and "units of the last place" in text


def test_grade_worked_cases():
    assert grade(0.1385, 0.1385, 4) == "agrees"
    assert grade(0.3081, 0.308047, 4, from_rounded=0.30806) == "rounded inputs"
    assert grade(1.7454, 1.7454607, 4) == "truncated"
    assert grade(0.1428, 0.142728, 4) == "last digit"
    assert grade(0.0651, 0.07441, 4) == "error"
    assert grade(0.125, 0.1245, 3) == "agrees"  # halves go away from zero, as by hand
    with pytest.raises(ValueError, match="decimals"):
        grade(0.1, 0.1, -1)
    with pytest.raises(ValueError, match="finite"):
        grade(float("nan"), 0.1, 2)


@given(st.floats(-100, 100, allow_nan=False), st.integers(0, 6))
def test_grade_property_rounding_always_agrees(x, d):
    printed = float(f"{x:.{d}f}")
    assert grade(printed, x, d) in ("agrees", "truncated")  # Python's rounding is half-even
    assert grade(printed + 3 * 10.0 ** -d, x, d) == "error"


def test_ffn_step_rejects_what_is_not_the_example():
    with pytest.raises(TypeError, match="WorkedExample"):
        ffn_step({"E": torch.zeros(5, 4)})


def test_comparison_rejects_bad_input():
    table = PublishedComparison("t")
    with pytest.raises(ValueError, match="shape"):
        table.add("Q", [[0.1, 0.2]], torch.zeros(2, 2))
    with pytest.raises(ValueError, match="from_rounded has 1 entries"):
        table.add("x", [0.1, 0.2], [0.1, 0.2], from_rounded=[0.1])
    with pytest.raises(TypeError, match="name"):
        table.add("", 0.1, 0.1)
