"""The preface's exercise solutions hold."""

import importlib.util
from pathlib import Path

PATH = Path(__file__).resolve().parents[1] / "notebooks" / "solutions" / "00_preface.py"
spec = importlib.util.spec_from_file_location("solutions_00", PATH)
solutions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(solutions)


def test_exercise_1_tanh_derivative():
    assert solutions.exercise_1() < 1e-15


def test_exercise_2_tanh_from_sigmoid():
    assert solutions.exercise_2() is True


def test_exercise_3_softplus():
    assert solutions.exercise_3() < 1e-14
