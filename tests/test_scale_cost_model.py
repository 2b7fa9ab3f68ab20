"""Tests for llmbook.scale.cost_model: memory, step time, MFU, calibration, layout search."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.scale import cost_model as cm

GPT3 = cm.GPT3_175B
A100 = cm.a100_cluster(1024)
LAYOUT = cm.Layout(8, 8, 16, 1, 1536, "full")


def test_parameter_count_and_flops() -> None:
    # Narayanan et al. 2021 table 1 lists 145.6B for L=80, h=12288 and 1008B for the 1T model
    m = cm.ModelSpec("x", 80, 12288, 96, 2048, 51200)
    assert round(m.params / 1e9, 1) == 145.6
    assert round(cm.GPT_1T.params / 1e9) == 1008
    assert cm.ModelSpec("y", 2, 4, 2, 3, 5, n_params=100).flops_per_token() == 600 + 12 * 2 * 4 * 3


def test_activation_formula_symbolic_and_table_2() -> None:
    s, b, h, a = sp.symbols("s b h a", positive=True)
    assert sp.simplify(cm.activation_memory_symbolic() - s * b * h * (34 + 5 * a * s / h)) == 0
    m = cm.ModelSpec("t", 1, 64, 4, 32, 10)
    sbh = 32 * 2 * 64
    none1 = cm.activation_bytes_per_layer(m, 2)
    assert none1 == pytest.approx(sbh * (34 + 5 * 4 * 32 / 64))
    assert cm.activation_bytes_per_layer(m, 2, 4, "none", True) == pytest.approx(none1 / 4)
    assert cm.activation_bytes_per_layer(m, 2, 4, "selective") == pytest.approx(sbh * (10 + 6))
    assert cm.activation_bytes_per_layer(m, 2, 4, "selective", True) == pytest.approx(34 * sbh / 4)
    assert cm.activation_bytes_per_layer(m, 2, 4, "full") == 2 * sbh
    with pytest.raises(ValueError, match="recompute"):
        cm.activation_bytes_per_layer(m, 2, 1, "some")


def test_memory_per_gpu_worked_example() -> None:
    mem = cm.memory_per_gpu(GPT3, LAYOUT)
    n = GPT3.params / 64
    assert mem["weights"] == pytest.approx(2 * n) and mem["optimizer"] == pytest.approx(12 * n)
    # full recomputation: 2sbh per layer, 12 layers per stage, 8 micro-batches in flight
    assert mem["activations"] == pytest.approx(12 * 8 * 2 * 2048 * 12288)
    z3 = cm.memory_per_gpu(GPT3, replace(LAYOUT, zero_stage=3))
    assert z3["weights"] == pytest.approx(2 * n / 16) and z3["grads"] == pytest.approx(2 * n / 16)
    assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))


def test_allreduce_time_alpha_beta() -> None:
    assert cm.allreduce_time(100.0, 1, 1.0, 1.0) == 0.0
    assert cm.allreduce_time(100.0, 4, 10.0, 0.5) == pytest.approx(2 * 3 * 0.5 + 1.5 * 100 / 10)


def test_predict_parts_and_mfu() -> None:
    pred = cm.predict(GPT3, A100, LAYOUT, cm.Efficiency(0.5, 0.0))
    parts = pred["compute"] + pred["bubble"] + pred["tp_comm"] + pred["pp_comm"] + pred["dp_comm"]
    assert pred["step_time"] == pytest.approx(parts)
    m = LAYOUT.n_microbatches
    assert m == 96
    assert pred["bubble"] == pytest.approx((pred["compute"] + pred["tp_comm"]) * 7 / 96)
    tokens = 1536 * 2048
    assert pred["mfu"] == pytest.approx(GPT3.flops_per_token() * tokens / pred["step_time"] / 1024 / 312e12)
    assert pred["hardware_tflops_per_gpu"] > pred["model_tflops_per_gpu"]  # recomputation
    no_pp = cm.predict(GPT3, A100, cm.Layout(8, 1, 128, 1, 1536, "full", zero_stage=3))
    assert no_pp["bubble"] == 0 and no_pp["pp_comm"] == 0


@settings(max_examples=25, deadline=None)
@given(e=st.floats(0.2, 0.9), v=st.sampled_from([1, 2, 3]))
def test_calibration_inverts_predict(e: float, v: int) -> None:
    lay = replace(LAYOUT, virtual_stages=v)
    pred = cm.predict(GPT3, A100, lay, cm.Efficiency(e))
    got = cm.calibrate_compute_efficiency(GPT3, A100, lay, pred["hardware_tflops_per_gpu"])
    assert got == pytest.approx(e, rel=1e-9)
    got = cm.calibrate_compute_efficiency(GPT3, A100, lay, pred["model_tflops_per_gpu"], hardware=False)
    assert got == pytest.approx(e, rel=1e-9)


def test_bad_layouts() -> None:
    with pytest.raises(ValueError, match="does not equal"):
        cm.predict(GPT3, A100, replace(LAYOUT, dp=8))
    with pytest.raises(ValueError, match="n_heads"):
        cm.check_layout(GPT3, cm.a100_cluster(640), replace(LAYOUT, tp=5, dp=16))
    with pytest.raises(ValueError, match="n_layers"):
        cm.check_layout(GPT3, cm.a100_cluster(640), replace(LAYOUT, pp=5))
    with pytest.raises(ValueError, match="global_batch"):
        cm.check_layout(GPT3, A100, replace(LAYOUT, global_batch=1000))
    with pytest.raises(ValueError, match="recompute"):
        cm.check_layout(GPT3, A100, replace(LAYOUT, recompute="half"))
    with pytest.raises(ValueError, match="zero_stage"):
        cm.check_layout(GPT3, A100, replace(LAYOUT, zero_stage=4))
    with pytest.raises(ValueError, match="compute must lie in"):
        cm.predict(GPT3, A100, LAYOUT, cm.Efficiency(0.0))
    with pytest.raises(ValueError, match="unreachable"):
        cm.calibrate_compute_efficiency(GPT3, A100, LAYOUT, 1e6)


def test_best_layout_fits_and_beats_every_other_fitting_layout() -> None:
    small = cm.ModelSpec("s", 8, 1024, 16, 512, 1000)
    cluster = cm.Cluster("16 small", 16, 100e12, 4e9, 100e9, 10e9)
    lay, pred = cm.best_layout(small, cluster, 64)
    assert pred["fits"] and lay.n_gpus == 16
    for t in (1, 2, 4, 8):
        for p in (1, 2, 4, 8):
            if 16 % (t * p):
                continue
            other = cm.Layout(t, p, 16 // (t * p), 1, 64, "none", t > 1)
            o = cm.predict(small, cluster, other)
            if o["fits"]:
                assert o["tokens_per_s"] <= pred["tokens_per_s"] * (1 + 1e-12)
    tiny_memory = replace(cluster, memory_bytes=1e3)
    assert cm.best_layout(small, tiny_memory, 64) is None


def test_published_runs_are_valid_and_calibration_reproduces_megatron() -> None:
    runs = cm.PUBLISHED_RUNS
    assert len(runs) >= 4 and all(r.source for r in runs)
    cal = runs[0]
    e = cm.calibrate_compute_efficiency(cal.model, cal.cluster, cal.layout, cal.reported_tflops, True)
    assert 0.4 < e < 0.7
    eff = cm.Efficiency(e)
    assert cm.predict(cal.model, cal.cluster, cal.layout, eff)["hardware_tflops_per_gpu"] == pytest.approx(140.0)
    for r in runs[1:]:
        pred = cm.predict(r.model, r.cluster, r.layout, eff)
        if r.reported_mfu is not None:
            assert 0.5 < pred["mfu"] / r.reported_mfu < 1.5
        if r.reported_tflops is not None:
            key = "hardware_tflops_per_gpu" if r.hardware else "model_tflops_per_gpu"
            assert 0.5 < pred[key] / r.reported_tflops < 1.5


def test_cluster_presets() -> None:
    assert cm.a100_cluster(8).peak_flops == 312e12
    assert cm.h100_cluster(8).peak_flops == 989e12
    assert cm.tpu_v4_cluster(4).memory_bytes == 32 * 2**30
