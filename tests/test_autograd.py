"""Tests for llmbook.training.autograd: the Value engine, the Value MLP, finite differences, gradcheck."""

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbook.training.autograd import (
    MLP,
    GradcheckError,
    Layer,
    Neuron,
    Value,
    finite_difference,
    gradcheck,
    mse_loss,
    numeric_gradient,
    topological_order,
)

F64 = torch.float64


# ---------------------------------------------------------------- Value: worked examples


def test_value_worked_example_by_hand():
    # f = a b + a^2 at a = 3, b = -2: f = -6 + 9 = 3, df/da = b + 2a = 4, df/db = a = 3
    a, b = Value(3.0), Value(-2.0)
    f = a * b + a**2
    f.backward()
    assert f.data == 3.0 and a.grad == 4.0 and b.grad == 3.0
    assert f.op == "+" and set(f.children) == {f.children[0], f.children[1]}


def test_value_matches_torch_on_every_operation():
    x0, y0 = 0.7, -1.3
    x, y = Value(x0), Value(y0)
    f = ((x * y + 2.0) / (x - 3.0) - y**3 + (-x).exp() * y.tanh() + (x + 2).log()
         + (x * y).sigmoid() + (y * -1).relu() + 2.0**x - 1 / y + 4 - x)
    f.backward()
    tx = torch.tensor(x0, dtype=F64, requires_grad=True)
    ty = torch.tensor(y0, dtype=F64, requires_grad=True)
    tf = ((tx * ty + 2.0) / (tx - 3.0) - ty**3 + (-tx).exp() * ty.tanh() + (tx + 2).log()
          + (tx * ty).sigmoid() + (-ty).relu() + 2.0**tx - 1 / ty + 4 - tx)
    tf.backward()
    assert abs(f.data - tf.item()) < 1e-14
    assert abs(x.grad - tx.grad.item()) < 1e-14 and abs(y.grad - ty.grad.item()) < 1e-14


def test_node_used_twice_gets_the_sum():
    a = Value(1.5)
    (a * a).backward()
    assert a.grad == 3.0  # 2a
    b = Value(2.0)
    c = b + b  # the same child twice
    d = c * b  # and again through another path: d = 2 b^2, dd/db = 4b
    d.backward()
    assert b.grad == 8.0


def test_relu_and_sigmoid_edge_cases():
    z = Value(0.0)
    z.relu().backward()
    assert z.grad == 0.0  # PyTorch's convention at 0
    big, small = Value(800.0).sigmoid(), Value(-800.0).sigmoid()
    assert big.data == 1.0 and small.data == 0.0  # no overflow in exp
    t = Value(-2.5)
    t.sigmoid().backward()
    s = 1 / (1 + math.exp(2.5))
    assert abs(t.grad - s * (1 - s)) < 1e-16


def test_pow_special_cases():
    x = Value(-2.0)
    (x**3).backward()
    assert x.grad == 12.0
    x0 = Value(0.0)
    (x0**0).backward()
    assert x0.grad == 0.0
    x2 = Value(0.0)
    (x2**2).backward()
    assert x2.grad == 0.0


def test_backward_accumulates_into_leaves_only_like_torch():
    a = Value(2.0)
    f = (a * 3.0).tanh()
    f.backward()
    first = a.grad
    f.backward()
    assert abs(a.grad - 2 * first) < 1e-15  # leaves accumulate, as torch's .grad
    ta = torch.tensor(2.0, dtype=F64, requires_grad=True)
    tf = (ta * 3.0).tanh()
    tf.backward(retain_graph=True)
    tf.backward()
    assert abs(a.grad - ta.grad.item()) < 1e-15


def test_deep_chain_of_ten_thousand_ops_does_not_recurse():
    x = Value(0.5)
    y = x
    for i in range(10_000):
        y = y * 1.0001 if i % 2 else y + 0.001
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # a recursive sort would fail at once
    try:
        y.backward()
        order = topological_order(y)
    finally:
        sys.setrecursionlimit(limit)
    assert abs(x.grad - 1.0001**5000) < 1e-12
    assert len(order) == 10_001 + 5_000 * 2  # nodes plus the constant leaves of + and *


def test_topological_order_children_before_parents():
    a, b = Value(1.0), Value(2.0)
    c = a * b
    d = c + a
    e = d * c
    order = topological_order(e)
    pos = {id(n): i for i, n in enumerate(order)}
    for node in order:
        for child in node.children:
            assert pos[id(child)] < pos[id(node)]
    assert order[-1] is e and len(order) == 5
    with pytest.raises(TypeError, match="expects a Value"):
        topological_order(3.0)


# ---------------------------------------------------------------- Value: errors


def test_value_errors():
    with pytest.raises(ValueError, match="log is defined for positive numbers only"):
        Value(0.0).log()
    with pytest.raises(ValueError, match=r"log\(-1"):
        Value(-1.0).log()
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        Value(1.0) / Value(0.0)
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        1.0 / Value(0.0)
    with pytest.raises(ZeroDivisionError, match=r"0 \*\* -1"):
        Value(0.0) ** -1
    with pytest.raises(TypeError, match="str"):
        Value(1.0) + "a"
    with pytest.raises(TypeError, match="str"):
        "a" * Value(1.0)
    with pytest.raises(TypeError, match="list"):
        Value([1.0])
    with pytest.raises(TypeError, match="bool"):
        Value(True)
    with pytest.raises(TypeError, match="exponent must be a constant"):
        Value(2.0) ** Value(3.0)
    with pytest.raises(ValueError, match="finite"):
        Value(float("nan"))
    with pytest.raises(ValueError, match="finite"):
        Value(1e308) * 10.0
    with pytest.raises(ValueError, match="finite"):
        Value(4.0) / 1e-308
    with pytest.raises(ValueError, match="local derivative overflows"):
        Value(1.0) / 1e-160  # the quotient is finite, its derivative -q/b is not
    with pytest.raises(OverflowError, match="overflows"):
        Value(800.0).exp()
    with pytest.raises(ValueError, match="non-integer power"):
        Value(-2.0) ** 0.5
    with pytest.raises(ValueError, match="positive constant base"):
        (-2.0) ** Value(1.0)


# ---------------------------------------------------------------- Value: properties

finite = st.floats(min_value=-5, max_value=5, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(finite, finite)
def test_value_arithmetic_matches_floats(x, y):
    vx, vy = Value(x), Value(y)
    assert (vx + vy).data == x + y
    assert (vx - vy).data == x - y
    assert (vx * vy).data == x * y
    assert (x * vy).data == x * y and (vx + y).data == x + y and (x - vy).data == x - y
    if abs(y) > 1e-100:  # smaller divisors may overflow (tested in test_value_errors)
        assert (vx / vy).data == x / y
    assert (-vx).data == -x
    assert vx.tanh().data == math.tanh(x)
    assert vx.exp().data == math.exp(x)


def _central(fn, x, eps=1e-6):
    return (fn(x + eps) - fn(x - eps)) / (2 * eps)


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0.2, max_value=3.0), st.floats(min_value=-2.0, max_value=2.0))
def test_value_derivative_matches_central_differences(x, y):
    def f_float(t):
        sigmoid = 1 / (1 + math.exp(-t))
        return math.tanh(t * y) * math.exp(-t) / (t + 1) + math.log(t) * t**1.5 - sigmoid

    def f_value(t):
        return (t * y).tanh() * (-t).exp() / (t + 1) + t.log() * t**1.5 - t.sigmoid()

    v = Value(x)
    out = f_value(v)
    out.backward()
    assert abs(out.data - f_float(x)) < 1e-12
    assert abs(v.grad - _central(f_float, x)) < 1e-7


# ---------------------------------------------------------------- the MLP


def _torch_copy(mlp):
    layers = []
    for i, (W, b) in enumerate(mlp.weights()):
        lin = torch.nn.Linear(len(W[0]), len(W), dtype=F64)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(W, dtype=F64))
            lin.bias.copy_(torch.tensor(b, dtype=F64))
        layers.append(lin)
        if i < len(mlp.layers) - 1:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def test_mlp_loss_and_gradients_equal_torch():
    mlp = MLP([3, 4, 4, 1], seed=3)
    net = _torch_copy(mlp)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(6, 3, generator=g, dtype=F64) * 2 - 1
    y = X.sum(-1).sin()
    loss = mse_loss([mlp(row)[0] for row in X.tolist()], y.tolist())
    loss.backward()
    ref = F.mse_loss(net(X).squeeze(-1), y)
    ref.backward()
    assert abs(loss.data - ref.item()) < 1e-14
    lins = [m for m in net if isinstance(m, torch.nn.Linear)]
    for lin, (dW, db) in zip(lins, mlp.gradients(), strict=True):
        assert torch.allclose(torch.tensor(dW, dtype=F64), lin.weight.grad, rtol=0, atol=1e-13)
        assert torch.allclose(torch.tensor(db, dtype=F64), lin.bias.grad, rtol=0, atol=1e-13)


def test_mlp_structure_init_and_zero_grad():
    mlp = MLP([3, 5, 2], activation="relu", seed=1)
    assert len(mlp.parameters()) == 3 * 5 + 5 + 5 * 2 + 2
    assert [n.activation for n in mlp.layers[0].neurons] == ["relu"] * 5
    assert [n.activation for n in mlp.layers[1].neurons] == ["linear"] * 2
    # U(-1/sqrt(n_in), 1/sqrt(n_in)) as torch.nn.Linear
    assert all(abs(p.data) <= 1 / math.sqrt(3) for p in mlp.layers[0].parameters())
    assert all(abs(p.data) <= 1 / math.sqrt(5) for p in mlp.layers[1].parameters())
    out = mlp([0.1, -0.2, 0.3])
    assert len(out) == 2
    sum(out).backward()
    assert any(p.grad != 0 for p in mlp.parameters())
    mlp.zero_grad()
    assert all(p.grad == 0 for p in mlp.parameters())
    assert MLP([3, 5, 2], seed=1).weights() == MLP([3, 5, 2], seed=1).weights()
    assert MLP([3, 5, 2], seed=1).weights() != MLP([3, 5, 2], seed=2).weights()


def test_mlp_errors():
    with pytest.raises(ValueError, match="expects 3 inputs, got 2"):
        MLP([3, 2])([1.0, 2.0])
    with pytest.raises(ValueError, match="at least an input and an output"):
        MLP([3])
    with pytest.raises(ValueError, match="activation must be one of"):
        Neuron(3, "gelu")
    with pytest.raises(ValueError, match="n_in must be a positive int"):
        Neuron(0)
    with pytest.raises(ValueError, match="n_out must be a positive int"):
        Layer(3, 0)
    with pytest.raises(ValueError, match="as many targets as predictions"):
        mse_loss([Value(1.0)], [1.0, 2.0])


# ---------------------------------------------------------------- finite differences


def test_finite_difference_orders():
    x = torch.tensor([0.3, 1.0, 2.0], dtype=F64)
    # forward error ~ eps/2 f'', central ~ eps^2/6 f''' for exp
    fwd = finite_difference(torch.exp, x, 1e-4, "forward")
    cen = finite_difference(torch.exp, x, 1e-4, "central")
    rel_fwd = ((fwd - x.exp()) / x.exp()).abs()
    rel_cen = ((cen - x.exp()) / x.exp()).abs()
    assert torch.allclose(rel_fwd, torch.full_like(x, 0.5e-4), rtol=1e-3)
    assert (rel_cen < 1e-8).all() and (rel_cen > 1e-10).all()
    with pytest.raises(ValueError, match="scheme must be"):
        finite_difference(torch.exp, x, 1e-4, "backward")
    with pytest.raises(ValueError, match="eps must be a positive"):
        finite_difference(torch.exp, x, 0.0)
    with pytest.raises(TypeError, match="floating-point tensor"):
        finite_difference(torch.exp, torch.tensor([1, 2]), 1e-3)


def test_finite_difference_optimal_steps_in_float64():
    x = torch.linspace(0.5, 1.5, 51, dtype=F64)

    def err(eps, scheme):
        fd = finite_difference(torch.exp, x, eps, scheme)
        return ((fd - x.exp()).abs() / x.exp()).median().item()

    # the V: both too small and too large a step are worse than the optimum
    assert err(1e-8, "forward") < err(1e-12, "forward") / 100
    assert err(1e-8, "forward") < err(1e-4, "forward") / 100
    assert err(1e-5, "central") < err(1e-10, "central") / 100
    assert err(1e-5, "central") < err(1e-2, "central") / 100


# ---------------------------------------------------------------- gradcheck


class _WrongSiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(x)  # missing x sigma (1 - sigma)


class _WrongMatmul(torch.autograd.Function):
    """a @ b for square matrices, whose backward forgets a transpose (shapes still fit)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, grad_output):
        a, b = ctx.saved_tensors
        return grad_output @ b.T, grad_output.T @ a  # the second should be a.T @ grad_output


class _WrongSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        p = torch.softmax(z, -1)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad_output):
        (p,) = ctx.saved_tensors
        return p * grad_output  # missing - p <g, p>


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, generator=g, dtype=F64) for s in shapes)


@pytest.mark.parametrize(
    ("name", "fn", "shapes"),
    [
        ("silu", F.silu, [(3, 4)]),
        ("sum of sin x", lambda x: (x.sin() * x).sum(), [(5,)]),
        ("softmax", lambda x: torch.softmax(x, -1), [(2, 5)]),
        ("attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         [(2, 3, 4), (2, 5, 4), (2, 5, 3)]),
        ("wrong silu", _WrongSiLU.apply, [(3, 4)]),
        ("wrong softmax", _WrongSoftmax.apply, [(2, 5)]),
        ("wrong matmul", _WrongMatmul.apply, [(3, 3), (3, 3)]),
    ],
)
def test_gradcheck_verdict_equals_torch(name, fn, shapes):
    inputs = _inputs(*shapes)
    ours = gradcheck(fn, inputs)
    ref = torch.autograd.gradcheck(fn, tuple(x.clone().requires_grad_() for x in inputs),
                                   raise_exception=False)
    assert bool(ours) == ref, ours.report()
    assert ours.passed == (not name.startswith("wrong"))


def test_gradcheck_result_details():
    (x,) = _inputs((3, 4), seed=1)
    good = gradcheck(F.silu, x)
    assert good and good.max_abs_error < 1e-8 and "passed" in good.report()
    assert torch.allclose(good.analytic[0], good.numeric[0], atol=1e-8)
    bad = gradcheck(_WrongSiLU.apply, x)
    assert not bad and "FAILED" in bad.report()
    s = torch.sigmoid(x)
    missing = x * s * (1 - s)  # the forgotten term, so the worst entry is where it is largest
    # the random projection v weights each entry: compare |v_i| * |missing_i|
    v = 2 * torch.rand(x.shape, generator=torch.Generator().manual_seed(0), dtype=F64) - 1
    i, idx = bad.worst
    expected = torch.unravel_index((v * missing).abs().argmax(), x.shape)
    assert i == 0 and idx == tuple(int(t) for t in expected)
    assert abs(bad.max_abs_error - (v * missing).abs().max().item()) < 1e-7
    with pytest.raises(GradcheckError, match="FAILED"):
        gradcheck(_WrongSiLU.apply, x, raise_exception=True)


def test_gradcheck_tolerance_is_what_it_says():
    (x,) = _inputs((4,), seed=2)

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return t.exp()

        @staticmethod
        def backward(ctx, grad_output):
            (t,) = ctx.saved_tensors
            return 1.01 * grad_output * t.exp()  # 1% too large

    assert not gradcheck(Scaled.apply, x)  # 1% > rtol = 0.1%
    assert gradcheck(Scaled.apply, x, rtol=0.02)


def test_gradcheck_refuses_float32_and_bad_input():
    x32 = torch.randn(3)
    with pytest.raises(TypeError, match="float32.*float64.*round-off"):
        gradcheck(torch.sin, x32)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        gradcheck(torch.sin, [[1.0, 2.0]])
    with pytest.raises(ValueError, match="at least one input"):
        gradcheck(torch.sin, ())
    with pytest.raises(ValueError, match="eps must be a positive"):
        gradcheck(torch.sin, torch.zeros(2, dtype=F64), eps=-1.0)
    with pytest.raises(TypeError, match="must return a float64 tensor"):
        gradcheck(lambda t: t.float(), torch.zeros(2, dtype=F64))


def test_gradcheck_handles_non_contiguous_and_unused_inputs():
    a = torch.randn(4, 3, dtype=F64).T  # non-contiguous (3, 4)
    b = torch.randn(2, dtype=F64)  # unused: gradient 0 both ways
    res = gradcheck(lambda p, q: (p.tanh() ** 2).sum(), (a, b))
    assert res and torch.equal(res.analytic[1], torch.zeros(2, dtype=F64))


# ---------------------------------------------------------------- numeric_gradient


def test_numeric_gradient_worked_example_and_non_square_inputs():
    x = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    (gx,) = numeric_gradient(lambda t: (t**2).sum(), x, eps=1e-5)
    assert torch.allclose(gx, torch.tensor([2.0, 4.0, 6.0], dtype=F64), atol=1e-9, rtol=0)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, generator=g, dtype=F64)
    b = torch.randn(3, 4, generator=g, dtype=F64)
    a_before, b_before = a.clone(), b.clone()
    ga, gb = numeric_gradient(lambda p, q: (p @ q).sum(), (a, b), eps=1e-6)
    # d sum(AB)/dA_ij = sum_k B_jk, d/dB_jk = sum_i A_ij (by hand)
    assert ga.shape == (2, 3) and gb.shape == (3, 4)
    assert torch.allclose(ga, b.sum(1).expand(2, 3), atol=1e-8, rtol=0)
    assert torch.allclose(gb, a.sum(0)[:, None].expand(3, 4), atol=1e-8, rtol=0)
    assert torch.equal(a, a_before) and torch.equal(b, b_before)  # inputs untouched


def test_numeric_gradient_equals_autograd_on_a_smooth_function():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, generator=g, dtype=F64)
    w = torch.randn(5, generator=g, dtype=F64)

    def f(t, v):
        return torch.log1p(torch.exp(t @ v)).sum() + torch.sin(t).prod()

    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    auto = torch.autograd.grad(f(xs, ws), (xs, ws))
    num = numeric_gradient(f, (x, w), eps=1e-5)
    for a_, n_ in zip(auto, num, strict=True):
        assert (a_ - n_).abs().max() < 1e-8


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=1, max_size=6), st.floats(-2, 2))
def test_numeric_gradient_is_exact_for_quadratics(values, c):
    # the central difference of a quadratic has no truncation error: only round-off remains
    x = torch.tensor(values, dtype=F64)
    (gx,) = numeric_gradient(lambda t: c * (t**2).sum() + t.sum(), x, eps=1e-3)
    assert torch.allclose(gx, 2 * c * x + 1, atol=1e-9, rtol=0)


def test_numeric_gradient_bad_input():
    x = torch.zeros(3, dtype=F64)
    with pytest.raises(TypeError, match="input 0"):
        numeric_gradient(lambda t: t.sum(), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="input 1"):
        numeric_gradient(lambda a, b: a.sum(), (x, [1.0]))
    with pytest.raises(ValueError, match="eps"):
        numeric_gradient(lambda t: t.sum(), x, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        numeric_gradient(lambda t: t.sum(), x, eps=True)
    with pytest.raises(ValueError, match="at least one"):
        numeric_gradient(lambda: 0.0, ())
