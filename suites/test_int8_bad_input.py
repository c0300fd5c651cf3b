"""INT8 bad input: every misuse raises TypeError/ValueError naming the argument and what was expected."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.run.subproc import env_with_repo
from kvbits import int8
from kvbits._runtime import triton_interpreted
from suites.int8_support import CUDA

CPU_X = torch.ones(4, 8)


@pytest.mark.parametrize(
    "x,error,match",
    [
        ([[1.0, 2.0]], TypeError, "x must be a torch.Tensor"),
        (
            torch.ones(4, 8, dtype=torch.int32),
            TypeError,
            "x must have dtype float32, float16, bfloat16",
        ),
        (torch.ones(4, 8, dtype=torch.float64), TypeError, "x must have dtype"),
        (torch.ones(8), ValueError, "x must have 2 dimensions"),
        (torch.ones(2, 4, 8), ValueError, "x must have 2 dimensions"),
        (torch.ones(0, 8), ValueError, "x must have at least one row and one column"),
        (torch.ones(4, 0), ValueError, "x must have at least one row and one column"),
    ],
    ids=["list", "int32", "float64", "rank1", "rank3", "no-rows", "no-cols"],
)
def test_bad_x(record, x, error, match):
    record.backend = "torch"
    with record.raises(error, match=match):
        int8.quantize_per_channel(x)
    with record.raises(error, match=match):
        int8.compute_scales(x)


def test_bad_variant(record):
    with record.raises(ValueError, match="variant must be one of"):
        int8.quantize_per_channel(CPU_X, variant="fast")
    with record.raises(ValueError, match="variant must be one of"):
        int8.dequantize_per_channel(
            torch.zeros(4, 8, dtype=torch.int8), torch.ones(8), variant="Vectorized"
        )


@pytest.mark.parametrize("variant", ["naive", "tiled", "coarsened", "vectorized"])
def test_cuda_variant_on_cpu_tensors(record, variant):
    record.variant = variant
    with record.raises(
        ValueError, match=f"variant='{variant}' runs on CUDA tensors; got tensors on cpu"
    ):
        int8.quantize_per_channel(CPU_X, variant=variant)
    with record.raises(ValueError, match="runs on CUDA tensors"):
        int8.dequantize_per_channel(
            torch.zeros(4, 8, dtype=torch.int8), torch.ones(8), variant=variant
        )


def test_cpu_baseline_needs_float32(record):
    record.variant = "cpu_baseline"
    with record.raises(TypeError, match="x must have dtype float32 for variant='cpu_baseline'"):
        int8.quantize_per_channel(CPU_X.half(), variant="cpu_baseline")


def test_triton_on_cpu_without_interpreter(record):
    """CPU tensors with Triton compiling for a GPU: a ValueError that names the interpreter. A
    run that compiles already is such a process; an interpreted run asks a child process."""
    record.variant = "triton"
    if not triton_interpreted():
        with record.raises(ValueError, match="interpreter", input="CPU tensors, compiled Triton"):
            int8.quantize_per_channel(torch.ones(2, 4), variant="triton")
        return
    code = (
        "import torch, kvbits.int8 as m\n"
        "try:\n    m.quantize_per_channel(torch.ones(2, 4), variant='triton')\n"
        "except ValueError as e:\n    print('VALUEERROR', e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env={**env_with_repo(), "TRITON_INTERPRET": "0"}, capture_output=True, text=True,
        timeout=120,
    )
    assert "VALUEERROR" in result.stdout and "interpreter" in result.stdout, (
        result.stdout + result.stderr
    )


def test_bad_dequantize_arguments(record):
    q = torch.zeros(4, 8, dtype=torch.int8)
    s = torch.ones(8)
    with record.raises(TypeError, match="q must have dtype int8"):
        int8.dequantize_per_channel(q.to(torch.uint8), s)
    with record.raises(ValueError, match="q must have 2 dimensions"):
        int8.dequantize_per_channel(q.flatten(), s)
    with record.raises(TypeError, match="scales must have dtype float32"):
        int8.dequantize_per_channel(q, s.double())
    with record.raises(ValueError, match="scales must have 1 dimensions"):
        int8.dequantize_per_channel(q, s[None, :])
    with record.raises(ValueError, match="scales must have D=8 elements"):
        int8.dequantize_per_channel(q, torch.ones(7))
    with record.raises(TypeError, match="scales must be a torch.Tensor"):
        int8.dequantize_per_channel(q, [1.0] * 8)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), float("-inf"), -0.0, 0.0])
@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_scales_no_x_gives_are_refused(record, bad, device):
    """dequantize_per_channel refuses a negative, NaN or Inf scale (a sign-flipped or poisoned
    reconstruction otherwise), naming scales and the column, on every variant; 0 and -0.0 (an
    all-zero column's) are scales quantize_per_channel gives, and reconstruct to 0."""
    q, s = int8.quantize_per_channel(torch.randn(4, 8, device=device))
    s[3] = bad
    for variant in int8.variants_for(device):
        record.variant = variant
        if bad == 0:
            assert not int8.dequantize_per_channel(q, s, variant=variant)[:, 3].any()
            continue
        with record.raises(ValueError, match=r"scales must be finite and non-negative .* column\(s\) \[3\] hold"):
            int8.dequantize_per_channel(q, s, variant=variant)


def test_bad_out(record):
    with record.raises(TypeError, match="out must be a \\(q, scales\\) pair"):
        int8.quantize_per_channel(CPU_X, out=torch.empty(4, 8, dtype=torch.int8))
    with record.raises(ValueError, match=r"out\[0\] \(q\) must have shape \(4, 8\)"):
        int8.quantize_per_channel(CPU_X, out=(torch.empty(4, 9, dtype=torch.int8), torch.empty(8)))
    with record.raises(TypeError, match=r"out\[1\] \(scales\) must have dtype float32"):
        int8.quantize_per_channel(
            CPU_X, out=(torch.empty(4, 8, dtype=torch.int8), torch.empty(8).half())
        )
    with record.raises(ValueError, match="out must be contiguous"):
        int8.dequantize_per_channel(
            torch.zeros(4, 8, dtype=torch.int8), torch.ones(8), out=torch.empty(8, 4).T
        )
    with record.raises(TypeError, match="out must have dtype float32"):
        int8.dequantize_per_channel(
            torch.zeros(4, 8, dtype=torch.int8), torch.ones(8), out=torch.empty(4, 8).half()
        )


def test_noncontiguous_input_is_not_reinterpreted(record):
    x = torch.randn(12, 10)
    view = x.T  # [10, 12], non-contiguous
    for variant in int8.variants_for("cpu"):
        q, s = int8.quantize_per_channel(view, variant=variant)
        q_ref, s_ref = int8.quantize_per_channel(view.contiguous(), variant="torch")
        assert torch.equal(q, q_ref) and torch.equal(s, s_ref), variant


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_vectorized_needs_d_multiple_of_4(record):
    record.variant = "vectorized"
    x = torch.ones(4, 6, device="cuda")
    with record.raises(ValueError, match="variant='vectorized' needs D .* multiple of 4; got D=6"):
        int8.quantize_per_channel(x, variant="vectorized")
    with record.raises(ValueError, match="got D=6"):
        int8.dequantize_per_channel(
            torch.zeros(4, 6, dtype=torch.int8, device="cuda"),
            torch.ones(6, device="cuda"),
            variant="vectorized",
        )
    q, s = int8.quantize_per_channel(x)  # variant=None falls back to coarsened
    assert torch.equal(q, int8.quantize_per_channel(x, variant="coarsened")[0])


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_device_mismatches(record):
    with record.raises(ValueError, match="variant='cpu_baseline' runs on CPU tensors"):
        int8.quantize_per_channel(torch.ones(4, 8, device="cuda"), variant="cpu_baseline")
    with record.raises(ValueError, match="tensors must share one device"):
        int8.dequantize_per_channel(
            torch.zeros(4, 8, dtype=torch.int8, device="cuda"), torch.ones(8)
        )
    with record.raises(ValueError, match=r"out\[0\] \(q\) must be on cuda"):
        int8.quantize_per_channel(
            torch.ones(4, 8, device="cuda"),
            out=(torch.empty(4, 8, dtype=torch.int8), torch.empty(8)),
        )


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_misaligned_views_on_gpu(record):
    base = torch.randn(4 * 8 + 1, device="cuda")
    x = base[1:].view(4, 8)  # 4-byte offset: not 16-byte aligned
    assert x.data_ptr() % 16
    for variant in int8.variants_for("cuda"):
        q, s = int8.quantize_per_channel(x, variant=variant)
        q_ref, s_ref = int8.quantize_per_channel(x.clone(), variant="torch")
        assert torch.equal(q, q_ref) and torch.equal(s, s_ref), variant


def test_default_variant_takes_the_unaligned_out_it_is_given(record):
    """variant=None on CUDA picks the vectorized kernel only when every output given is 16-byte
    aligned (a slice of a cache may not be), else the coarsened one, which takes any alignment;
    decided from the tensors alone, so it is checked on any machine."""
    cuda = torch.device("cuda")
    buffer = torch.empty(4 * 12 + 4, dtype=torch.float32)
    aligned, offset = buffer[:48].view(4, 12), buffer[1:49].view(4, 12)
    assert aligned.data_ptr() % 16 == 0 and offset.data_ptr() % 16
    assert int8._resolve_variant(None, cuda, 12) == "vectorized"
    assert int8._resolve_variant(None, cuda, 12, (aligned, None)) == "vectorized"
    assert int8._resolve_variant(None, cuda, 12, (offset,)) == "coarsened"
    assert int8._resolve_variant(None, cuda, 12, (None, offset)) == "coarsened"
    assert int8._resolve_variant(None, cuda, 6, (aligned,)) == "coarsened"
    assert int8._resolve_variant(None, torch.device("cpu"), 12, (offset,)) == "torch"
    record.add(states_checked=6)
