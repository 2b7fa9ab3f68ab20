"""Tests for llmbook.scale.pipeline: schedules, bubble, gradients across processes, memory."""

from __future__ import annotations

from fractions import Fraction

import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.scale import pipeline as pp

pytestmark = pytest.mark.usefixtures("one_thread")
f64 = torch.float64


def data(seed: int = 0, B: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 6, generator=g, dtype=f64), torch.randn(B, 5, generator=g, dtype=f64)


MODEL = pp.make_mlp_stack([6, 8, 8, 8, 8, 8, 5], seed=0)


def test_schedules_worked_example() -> None:
    assert pp.gpipe_schedule(2, 2) == [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]] * 2
    assert pp.one_f_one_b_schedule(2, 3) == [
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]]
    assert pp.schedule("gpipe", 3, 2) == pp.gpipe_schedule(3, 2)
    with pytest.raises(ValueError, match="unknown"):
        pp.schedule("zb", 2, 2)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 6), extra=st.integers(0, 6))
def test_1f1b_runs_every_op_once_with_bounded_in_flight(p: int, extra: int) -> None:
    m = p + extra
    for s, ops in enumerate(pp.one_f_one_b_schedule(p, m)):
        assert sorted(ops) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        held = peak = 0
        for kind, _ in ops:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        assert peak == p - s


def test_bubble_fraction_exact_and_symbolic() -> None:
    assert pp.bubble_fraction(4, 8) == Fraction(3, 11)
    assert pp.bubble_fraction(1, 5) == 0
    p, m = sp.symbols("p m", positive=True)
    assert sp.simplify(pp.bubble_fraction_symbolic() - (p - 1) / (m + p - 1)) == 0


def test_bad_inputs_raise_value_errors() -> None:
    x, y = data()
    with pytest.raises(ValueError, match="at least as many micro-batches"):
        pp.one_f_one_b_schedule(4, 3)
    with pytest.raises(ValueError, match="at least as many micro-batches"):
        pp.run_pipeline(MODEL, x, y, 3, 2, "1f1b")
    with pytest.raises(ValueError, match="not divisible"):
        pp.run_pipeline(MODEL, x, y, 2, 5, "gpipe")
    with pytest.raises(ValueError, match="does not divide"):
        pp.run_pipeline(MODEL, x, y, 4, 4, "gpipe")
    with pytest.raises(ValueError, match="same batch"):
        pp.check_pipeline(MODEL, x, y[:6], 2, 2, "gpipe")
    with pytest.raises(TypeError, match="floating-point"):
        pp.check_pipeline(MODEL, x.long(), y, 2, 2, "gpipe")
    with pytest.raises(ValueError, match="widths"):
        pp.make_mlp_stack([4])
    with pytest.raises(TypeError, match="nn.Sequential"):
        pp.split_stages(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="tick"):
        pp.measured_bubble([pp.StageReport(0)], "ms")
    with pytest.raises(ValueError, match="at least one"):
        pp.measured_bubble([])


def test_split_stages_and_microbatches() -> None:
    stages = pp.split_stages(MODEL, 3)
    x, _ = data()
    h = x
    for st_ in stages:
        h = st_(h)
    assert torch.equal(h, MODEL(x))
    parts = pp.split_microbatches(x, 4)
    assert len(parts) == 4 and torch.equal(torch.cat(parts), x)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_pipeline_gradients_bubble_and_memory(name: str) -> None:
    x, y = data(1)
    loss, ref = pp.reference_gradients(MODEL, x, y)
    p, m = 3, 6
    reps = pp.run_pipeline(MODEL, x, y, p, m, name, timeout=30)
    grads = [g for r in reps for g in r.grads]
    assert len(grads) == len(ref)
    assert max(float((a - b).abs().max()) for a, b in zip(grads, ref, strict=True)) < 1e-12
    assert abs(reps[-1].loss - loss) < 1e-12
    total, per_stage = pp.measured_bubble(reps, "tick")
    assert total == pp.bubble_fraction(p, m) and per_stage == [total] * p
    expected = [m] * p if name == "gpipe" else [p - s for s in range(p)]
    assert [r.peak_microbatches for r in reps] == expected
    assert [r.peak_activation_bytes for r in reps] == [k * r.activation_bytes[0]
                                                       for k, r in zip(expected, reps, strict=True)]
    # stage 0 keeps the block inputs: x (2 x 6) and two tanh outputs (2 x 8), float64
    assert reps[0].activation_bytes[0] == 8 * (2 * 6 + 2 * 8 + 2 * 8)


def test_several_runs_in_one_launch_ticks_and_wall_clock() -> None:
    x, y = data(2)
    runs = [{"num_microbatches": 4, "schedule_name": "1f1b", "t_f": 1, "t_b": 1},
            {"num_microbatches": 4, "schedule_name": "gpipe", "t_f": 2, "t_b": 3},
            {"num_microbatches": 4, "schedule_name": "1f1b", "compute_seconds": 0.002}]
    ticks_equal, ticks_23, timed = pp.run_pipelines(MODEL, x, y, 2, runs, timeout=30)
    assert pp.measured_bubble(ticks_equal, "tick")[0] == Fraction(1, 5)
    assert pp.measured_bubble(ticks_23, "tick")[0] == Fraction(1, 5)
    assert max(e[3] for r in ticks_23 for e in r.events) == (4 + 1) * (2 + 3)  # makespan
    wall, per = pp.measured_bubble(timed, "wall")
    assert 0 < wall < 1 and len(per) == 2
    for reps in (ticks_equal, ticks_23, timed):  # each run starts from fresh gradients
        assert [r.peak_microbatches for r in reps] == ([2, 1] if reps is not ticks_23 else [4, 4])
    _, ref = pp.reference_gradients(MODEL, x, y)
    assert all(torch.allclose(a, b, atol=1e-12)
               for a, b in zip([g for r in timed for g in r.grads], ref, strict=True))
    with pytest.raises(TypeError, match="non-empty"):
        pp.run_pipelines(MODEL, x, y, 2, [])
    with pytest.raises(ValueError, match="at least as many"):
        pp.run_pipelines(MODEL, x, y, 3, [{"num_microbatches": 2}])
