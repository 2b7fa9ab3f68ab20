"""Tests for llmbook.inference.flash_triton: the Triton kernels, run on the CPU by the Triton interpreter.

TRITON_INTERPRET=1 is set before the kernels are defined, so every kernel runs in NumPy;
sizes are small (the interpreter executes each program in Python). On a machine with a
GPU and without the variable, the same tests run the compiled kernels on CUDA tensors.
"""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before llmbook.inference.flash_triton defines kernels

pytest.importorskip("triton", reason="triton is not installed (Linux-only wheels); the Triton "
                                     "kernels of llmbook.inference.flash_triton cannot be tested")

from llmbook.inference import flash_triton  # noqa: E402
from llmbook.inference.flash import flash_attention_reference, flash_attention_triton  # noqa: E402
from llmbook.transformer.attention import scaled_dot_product_attention  # noqa: E402

DEVICE = "cpu" if flash_triton.interpreted() else "cuda"


def _randn(*shape, seed=0, dtype=torch.float32, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float32).to(device=DEVICE, dtype=dtype)
    return t.requires_grad_(requires_grad)


def _err(a, b):
    return (a.double() - b.double()).abs().max().item()


def _qkv_grads(fn, q, k, v, do, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, **kw)
    return out, torch.autograd.grad(out, (q, k, v), do)


CASES = [  # (B, H, T_q, T_k, d, causal, blocks)
    (2, 2, 37, 37, 16, False, None),
    (2, 2, 37, 37, 16, True, None),
    (1, 2, 70, 70, 32, True, (32, 16)),
    (1, 2, 45, 70, 16, False, None),
    (1, 2, 70, 33, 24, False, (16, 32)),  # d not a power of two, T_q > T_k
]


@pytest.mark.parametrize("B,H,T_q,T_k,d,causal,blocks", CASES)
def test_forward_and_gradients_equal_naive_attention_float32(B, H, T_q, T_k, d, causal, blocks):
    q, k, v = _randn(B, H, T_q, d, seed=1), _randn(B, H, T_k, d, seed=2), _randn(B, H, T_k, d, seed=3)
    do = _randn(B, H, T_q, d, seed=4)
    kw = {} if blocks is None else {"block_m": blocks[0], "block_n": blocks[1]}
    out, grads = _qkv_grads(flash_attention_triton, q, k, v, do, is_causal=causal, **kw)
    ours_naive, grads_naive = _qkv_grads(scaled_dot_product_attention, q, k, v, do,
                                         is_causal=causal)
    torch_out, grads_torch = _qkv_grads(F.scaled_dot_product_attention, q, k, v, do,
                                        is_causal=causal)
    assert out.shape == (B, H, T_q, d) and out.dtype == torch.float32
    assert _err(out, ours_naive) < 1e-5 and _err(out, torch_out) < 1e-5
    for g, g_naive, g_torch in zip(grads, grads_naive, grads_torch, strict=True):
        assert g.shape == g_naive.shape
        assert _err(g, g_naive) < 1e-5 and _err(g, g_torch) < 1e-5


def test_forward_saves_the_log_sum_exp():
    q, k, v = _randn(2, 40, 16, seed=5), _randn(2, 40, 16, seed=6), _randn(2, 40, 16, seed=7)
    out, lse = flash_triton.flash_attention_forward(q, k, v, is_causal=True)
    ref_out, ref_lse = flash_attention_reference(q, k, v, is_causal=True, return_lse=True)
    assert lse.shape == (2, 40) and lse.dtype == torch.float32
    assert _err(out, ref_out) < 1e-5 and _err(lse, ref_lse) < 1e-5


def test_causal_gradients_of_the_future_are_zero():
    q, k, v = _randn(1, 40, 16, seed=8), _randn(1, 40, 16, seed=9), _randn(1, 40, 16, seed=10)
    do = torch.zeros(1, 40, 16, device=DEVICE)
    do[:, :10] = 1.0  # only the first 10 outputs matter: keys 10.. get no gradient
    _, (dq, dk, dv) = _qkv_grads(flash_attention_triton, q, k, v, do, is_causal=True)
    assert (dk[:, 10:] == 0).all() and (dv[:, 10:] == 0).all() and (dq[:, 10:] == 0).all()
    assert dk[:, :10].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_as_accurate_as_torch(dtype):
    q, k, v = (_randn(1, 2, 48, 32, seed=i, dtype=dtype) for i in range(3))
    do = _randn(1, 2, 48, 32, seed=3, dtype=dtype)
    exact, grads_exact = _qkv_grads(F.scaled_dot_product_attention, q.float(), k.float(),
                                    v.float(), do.float(), is_causal=True)
    out, grads = _qkv_grads(flash_attention_triton, q, k, v, do, is_causal=True)
    ref, grads_ref = _qkv_grads(F.scaled_dot_product_attention, q, k, v, do, is_causal=True)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    # within twice PyTorch's own rounding error in this dtype (plus one unit of it)
    unit = torch.finfo(dtype).eps
    assert _err(out, exact) <= 2 * _err(ref, exact) + unit
    for g, g_ref, g_exact in zip(grads, grads_ref, grads_exact, strict=True):
        assert _err(g, g_exact) <= 2 * _err(g_ref, g_exact) + 4 * unit


def test_non_contiguous_inputs_and_leading_dims():
    x = _randn(2, 33, 3, 16, seed=11)  # (B, T, H, d) viewed as (B, H, T, d): not contiguous
    q = x.transpose(1, 2)
    out = flash_attention_triton(q, q, q)
    assert _err(out, F.scaled_dot_product_attention(q, q, q)) < 1e-5
    q3 = _randn(33, 16, seed=12)  # no leading dimensions at all
    assert _err(flash_attention_triton(q3, q3, q3, scale=0.5),
                F.scaled_dot_product_attention(q3, q3, q3, scale=0.5)) < 1e-5


def test_autograd_function_apply_with_defaults():
    q, k, v = (_randn(1, 2, 21, 16, seed=i, requires_grad=True) for i in range(3))
    out = flash_triton.FlashAttentionFunction.apply(q, k, v)
    assert _err(out, F.scaled_dot_product_attention(q, k, v)) < 1e-5
    out.sum().backward()
    _, grads = _qkv_grads(F.scaled_dot_product_attention, q, k, v, torch.ones_like(out))
    for g, g_torch in zip((q.grad, k.grad, v.grad), grads, strict=True):
        assert _err(g, g_torch) < 1e-5
    with pytest.raises(ValueError, match="the kernels need one head dimension"):
        flash_triton.FlashAttentionFunction.apply(q, k[..., :8], v)


def test_bad_inputs():
    q = _randn(1, 20, 16)
    with pytest.raises(TypeError, match=r"float64.*flash_attention_reference"):
        flash_attention_triton(q.double(), q.double(), q.double())
    with pytest.raises(TypeError, match=r"share a dtype"):
        flash_attention_triton(q, q.half(), q.half())
    with pytest.raises(ValueError, match=r"one head dimension.*\(1, 20, 8\)"):
        flash_attention_triton(q, q, _randn(1, 20, 8))
    with pytest.raises(ValueError, match=r"equal leading dimensions.*\(2, 20, 16\)"):
        flash_attention_triton(q, _randn(2, 20, 16), _randn(2, 20, 16))
    with pytest.raises(ValueError, match=r"positions T_k.*\(1, 21, 16\)"):
        flash_attention_triton(q, q, _randn(1, 21, 16))
    with pytest.raises(ValueError, match=r"block_m must be a power of two >= 16, got 24"):
        flash_attention_triton(q, q, q, block_m=24, block_n=16)
    with pytest.raises(ValueError, match=r"both block_m and block_n"):
        flash_attention_triton(q, q, q, block_m=16)
    with pytest.raises(ValueError, match=r"block_m a multiple of block_n, got 16 and 32"):
        flash_attention_triton(q, q, q, is_causal=True, block_m=16, block_n=32)
    with pytest.raises(ValueError, match=r"d <= 256"):
        flash_attention_triton(_randn(1, 4, 512), _randn(1, 4, 512), _randn(1, 4, 512))
    with pytest.raises(TypeError, match=r"torch.Tensor"):
        flash_attention_triton(q.tolist(), q, q)


def test_kernels_compile_for_an_h100_without_one(tmp_path):
    """The real compiler (not the interpreter) accepts the kernels: Triton -> PTX -> cubin."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia", reason="triton has no NVIDIA backend here")
    code = ("from llmbook.inference.flash_triton import compile_for_gpu\n"
            "ks = compile_for_gpu('fp16', head_dim=64, is_causal=True, capability=90)\n"
            "print(sorted(ks), all('cubin' in k.asm for k in ks.values()),\n"
            "      ks['forward'].asm['ptx'].count('wgmma') > 0)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"TRITON_CACHE_DIR": str(tmp_path), "TRITON_DEFAULT_FP_FUSION": "1"})
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[0] == ("['backward_dkdv', 'backward_dq', 'backward_preprocess', "
                                         "'forward'] True True")


def test_compile_for_gpu_refuses_under_the_interpreter():
    if not flash_triton.interpreted():
        pytest.skip("the kernels are compiled here")
    with pytest.raises(RuntimeError, match=r"without TRITON_INTERPRET=1"):
        flash_triton.compile_for_gpu()
