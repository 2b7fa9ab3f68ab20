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


# ---------------------------------------------------------------- issue 25: all-to-all, overlap, OPT


def test_alltoall_symbolic_by_counting_blocks() -> None:
    p, n, alpha, beta = sp.symbols("p n alpha beta", positive=True)
    cost = cm.alltoall_cost_symbolic()
    # independent count: every rank keeps 1 of its p blocks and sends the other p - 1, one message each
    assert sp.simplify(cost["time"] - ((p - 1) * alpha + (p - 1) * (n / p) * beta)) == 0
    assert sp.simplify(cost["bytes_per_rank"] - (n - n / p)) == 0
    # half of the ring all-reduce's bandwidth term
    assert sp.simplify(cost["bytes_per_rank"] * 2 - 2 * (p - 1) / p * n) == 0


def test_alltoall_time_worked_example_and_bad_input() -> None:
    assert cm.alltoall_time(120.0, 4, 10.0, 0.5) == pytest.approx(3 * 0.5 + 0.75 * 120 / 10)
    assert cm.alltoall_time(120.0, 1, 10.0, 0.5) == 0.0
    sym = cm.alltoall_cost_symbolic()["time"]
    p, n, alpha, beta = sp.symbols("p n alpha beta", positive=True)
    assert float(sym.subs({p: 3, n: 90, alpha: 0.25, beta: 0.5})) == pytest.approx(cm.alltoall_time(90, 3, 2.0, 0.25))
    with pytest.raises(ValueError, match="ranks"):
        cm.alltoall_time(1.0, 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="bandwidth"):
        cm.alltoall_time(1.0, 2, 0.0, 0.0)


def test_expert_parallel_time_counts_four_alltoalls_of_chapter_21_bytes() -> None:
    from llmbook.scale.moe import all_to_all_bytes

    cluster = cm.Cluster("c", 16, 1e12, 1e9, 100.0, 10.0, gpus_per_node=8, latency=0.0)
    # 8 ranks (one node): bytes that cross = chapter 21's 2nkdb (ep - 1)/ep per pass, x2 with backward
    t = cm.expert_parallel_time(5, 3, 2, 8, cluster, top_k=2, bytes_per_value=2)
    crossing = 2 * all_to_all_bytes(5, 3, 2, 2, ep_size=8)  # forward + backward, one layer
    assert t == pytest.approx(2 * crossing / 100.0)
    # 16 ranks leave the node: inter-node bandwidth; capacity factor scales the buffers
    t16 = cm.expert_parallel_time(5, 3, 1, 16, cluster, capacity_factor=1.25)
    assert t16 == pytest.approx(4 * (15 / 16) * 1.25 * 5 * 3 * 2 / 10.0)
    assert cm.expert_parallel_time(5, 3, 1, 1, cluster) == 0.0
    with pytest.raises(TypeError, match="cluster"):
        cm.expert_parallel_time(5, 3, 1, 2, "c")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity_factor"):
        cm.expert_parallel_time(5, 3, 1, 2, cluster, capacity_factor=0.0)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 64), st.floats(0.0, 1e9), st.floats(1.0, 1e12), st.floats(0.0, 1e-3))
def test_alltoall_at_most_half_allreduce_bandwidth(k: int, n: float, bw: float, lat: float) -> None:
    a2a = cm.alltoall_time(n, k, bw, lat)
    ar = cm.allreduce_time(n, k, bw, lat)
    assert a2a <= ar / 2 + 1e-12 * (1 + ar)


def test_overlap_sensitivity_flips_the_layout_and_ranges() -> None:
    model = cm.ModelSpec("145.6B", 80, 12288, 96, 2048, 51200)
    eff = cm.Efficiency(compute=0.54)
    sweep = cm.overlap_sensitivity(model, cm.a100_cluster(1024), 2048, (0.0, 1.0), eff)
    assert [o for o, _, _ in sweep] == [0.0, 1.0]
    for o, lay, pred in sweep:  # each entry is best_layout at that overlap
        assert (lay, pred) == cm.best_layout(model, cm.a100_cluster(1024), 2048, replace(eff, dp_overlap=o))
    (_, hidden_none, p0), (_, hidden_all, p1) = sweep
    assert hidden_none != hidden_all  # the guessed overlap changes the chosen layout
    assert hidden_all.dp > hidden_none.dp  # free data-parallel traffic favours more data parallelism
    ranges = cm.layout_ranges(sweep)
    assert ranges["dp"] == (hidden_none.dp, hidden_all.dp)
    assert ranges["mfu"] == (p0["mfu"], p1["mfu"]) and ranges["distinct"] == (2,)
    with pytest.raises(ValueError, match="overlaps"):
        cm.overlap_sensitivity(model, cm.a100_cluster(1024), 2048, ())
    with pytest.raises(ValueError, match="no layout fits"):
        cm.layout_ranges([(0.5, None, None)])


def test_opt_row_is_scored_against_147_tflops_counting_recomputation() -> None:
    opt = next(r for r in cm.PUBLISHED_RUNS if r.name == "OPT-175B")
    assert opt.reported_tflops == 147.0 and opt.hardware and opt.layout.recompute == "full"
    assert opt.model.vocab_size == 50272 and opt.layout.n_gpus == opt.cluster.n_gpus == 992
    cal = cm.PUBLISHED_RUNS[0]
    e = cm.calibrate_compute_efficiency(cal.model, cal.cluster, cal.layout, cal.reported_tflops, cal.hardware)
    pred = cm.predict(opt.model, opt.cluster, opt.layout, cm.Efficiency(compute=e))
    # hardware FLOPs = model FLOPs x (8N + 16Lhs)/(6N + 12Lhs) under full recomputation
    n, L, h, s = opt.model.params, 96, 12288, 2048
    ratio = (8 * n + 16 * L * h * s) / (6 * n + 12 * L * h * s)
    assert pred["hardware_tflops_per_gpu"] == pytest.approx(pred["model_tflops_per_gpu"] * ratio)
    assert 0.85 < pred["hardware_tflops_per_gpu"] / 147.0 < 0.95
