"""The preface's exercise solutions hold."""


from solution_loader import load_solutions

solutions = load_solutions("00_preface")


def test_exercise_1_tanh_derivative():
    assert solutions.exercise_1() < 1e-15


def test_exercise_2_tanh_from_sigmoid():
    assert solutions.exercise_2() is True


def test_exercise_3_softplus():
    assert solutions.exercise_3() < 1e-14
