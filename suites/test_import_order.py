"""The Triton interpreter on a machine without a GPU, whatever was imported before kvbits.

triton decides at each ``@triton.jit`` decoration whether the function is compiled or interpreted,
so triton imported before kvbits (directly, or by ``from transformers import
AutoModelForCausalLM``) has its own library (``tl.sum``, ``tl.max``, ...) built for compiling;
``kvbits._runtime`` rebuilds it for the interpreter. Each case is a fresh process with no GPU and
TRITON_INTERPRET unset, which imports something first, then kvbits, and runs every family of Triton
kernels on CPU tensors against the torch backend.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from harness.run.subproc import env_with_repo

KERNELS = """
import torch, kvbits, kvbits.int8
torch.manual_seed(0)
v = torch.randint(0, 8, (4, 64), dtype=torch.uint8)
packed = kvbits.pack_bits(v, bits=3, backend="triton")
assert torch.equal(packed, kvbits.pack_bits(v, bits=3, backend="torch"))
assert torch.equal(kvbits.unpack_bits(packed, bits=3, backend="triton")[..., :64], v)
k, val = torch.randn(2, 1, 2, 80, 64, dtype=torch.float16).unbind(0)
qkv = kvbits.quantize_kv(k, val, bits=3, backend="triton")
ref = kvbits.quantize_kv(k, val, bits=3, backend="torch")
for got, want in zip(kvbits.dequantize_kv(qkv), kvbits.dequantize_kv(ref)):
    assert torch.allclose(got.float(), want.float(), atol=1e-2)
q = torch.randn(1, 2, 64, dtype=torch.float16)
out = kvbits.decode_attention(q, qkv, backend="triton")
assert torch.allclose(out.float(), kvbits.decode_attention(q, qkv, backend="torch").float(), atol=2e-2)
x = torch.randn(16, 64)
codes, scales = kvbits.int8.quantize_per_channel(x, variant="triton")
want_codes, want_scales = kvbits.int8.quantize_per_channel(x, variant="torch")
assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)
print("KERNELS OK")
"""

FIRST = {
    "kvbits first": "",
    "triton first": "import triton\n",
    "transformers first": "from transformers import AutoModelForCausalLM\nimport sys\nassert 'triton' in sys.modules\n",
    "variable set after triton": "import os, triton\nos.environ['TRITON_INTERPRET'] = '1'\n",
}


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in env_with_repo().items() if key != "TRITON_INTERPRET"}
    environ.update({"CUDA_VISIBLE_DEVICES": "", **env})  # no GPU, whatever this machine has
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("first", list(FIRST))
def test_triton_kernels_run_on_cpu_whatever_was_imported_first(record, first):
    record.variant = "triton"
    record.device = "cpu"
    if first.startswith("transformers") and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    result = _run(FIRST[first] + KERNELS)
    assert result.returncode == 0 and "KERNELS OK" in result.stdout, result.stdout + result.stderr[-4000:]


def test_an_explicit_compiled_mode_says_what_to_set(record):
    """TRITON_INTERPRET=0 chosen by the caller is kept: CPU tensors are refused, naming the variable."""
    record.variant = "triton"
    record.device = "cpu"
    code = ("import triton, torch, kvbits\n"
            "try:\n    kvbits.pack_bits(torch.zeros(4, 64, dtype=torch.uint8), bits=3, backend='triton')\n"
            "except ValueError as e:\n    print('VALUEERROR', e)\n")
    result = _run(code, TRITON_INTERPRET="0")
    assert "VALUEERROR" in result.stdout and "TRITON_INTERPRET=1" in result.stdout, result.stdout + result.stderr
