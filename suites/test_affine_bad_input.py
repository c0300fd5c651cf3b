"""Bad input to quantize_kv / append / dequantize_kv: a clear TypeError or ValueError naming the
argument, on every backend; each case records its error type and message (a catalogue)."""

from __future__ import annotations

import warnings

import pytest
import torch
from affine_support import device_backends, random_kv

import kvbits
from kvbits.kv_cache import QuantizedKV


def _kv(dtype=torch.float16, shape=(1, 2, 70, 64), device="cpu"):
    return random_kv(shape, dtype, device, seed=11)


def _with(tensor, index, value):
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


def _nan_in_group(device, backend):
    k, v = _kv(device=device)
    return kvbits.quantize_kv(_with(k, (0, 1, 5, 3), float("nan")), v, backend=backend)


def _inf_in_v(device, backend):
    k, v = _kv(device=device)
    return kvbits.quantize_kv(k, _with(v, (0, 0, 40, 0), float("inf")), backend=backend)


def _neg_inf_in_residual(device, backend):
    k, v = _kv(device=device)  # S = 70, G = 64: token 66 is in the residual window
    return kvbits.quantize_kv(_with(k, (0, 0, 66, 1), float("-inf")), v, backend=backend)


def _scale_overflow_fp16(device, backend):
    k, v = _kv(torch.float32, device=device)
    return kvbits.quantize_kv(k * 1e6, v, scale_dtype=torch.float16, backend=backend)


def _shape_mismatch(device, backend):
    k, v = _kv(device=device)
    return kvbits.quantize_kv(k, v[:, :, :-1], backend=backend)


def _dtype_mismatch(device, backend):
    k, v = _kv(device=device)
    return kvbits.quantize_kv(k, v.float(), backend=backend)


def _int_dtype(device, backend):
    k, v = _kv(device=device)
    return kvbits.quantize_kv(k.to(torch.int8), v.to(torch.int8), backend=backend)


def _rank3(device, backend):
    k, v = _kv(device=device)
    return kvbits.quantize_kv(k[0], v[0], backend=backend)


def _head_dim_not_multiple(device, backend):
    k, v = _kv(shape=(1, 1, 64, 48), device=device)
    return kvbits.quantize_kv(k, v, group_size=32, backend=backend)


def _head_dim_below_group(device, backend):
    k, v = _kv(shape=(1, 1, 64, 64), device=device)
    return kvbits.quantize_kv(k, v, group_size=128, backend=backend)


def _bits_5(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), bits=5, backend=backend)


def _bits_str(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), bits="3", backend=backend)


def _group_16(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), group_size=16, backend=backend)


def _scale_bf16(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), scale_dtype=torch.bfloat16, backend=backend)


def _capacity_not_multiple(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), capacity=100, backend=backend)


def _capacity_too_small(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), capacity=64, backend=backend)  # S = 70 needs 128


def _seq_lens_too_long(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), seq_lens=[71], backend=backend)


def _not_a_tensor(device, backend):
    k, v = _kv(device=device)
    return kvbits.quantize_kv(k.tolist(), v, backend=backend)


def _backend_cuda(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), backend="cuda")


def _backend_unknown(device, backend):
    return kvbits.quantize_kv(*_kv(device=device), backend="numpy")


def _append_wrong_heads(device, backend):
    qkv = QuantizedKV.empty(1, 2, 64, group_size=64, device=device)
    k, v = _kv(shape=(1, 3, 4, 64), device=device)
    return qkv.append(k, v, backend=backend)


def _append_wrong_dtype(device, backend):
    qkv = QuantizedKV.empty(1, 2, 64, group_size=64, device=device)
    k, v = _kv(torch.float32, shape=(1, 2, 4, 64), device=device)
    return qkv.append(k, v, backend=backend)


def _dequantize_not_a_cache(device, backend):
    return kvbits.dequantize_kv({"k_codes": torch.zeros(1)})


def _empty_capacity_not_multiple(device, backend):
    return QuantizedKV.empty(1, 1, 64, group_size=64, capacity=65, device=device)


def _append_to_strided_cache(device, backend):
    """A batch of two whose tensors are views of two of four heads: the Triton path refuses it
    (the torch path takes strided tensors, so the case runs for the Triton backend only)."""
    if backend != "triton":
        pytest.skip("a check of the Triton append; the torch append takes strided caches")
    whole = QuantizedKV.empty(2, 4, 64, capacity=64, device=device)
    fields = ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero", "k_residual", "v_residual")
    half = QuantizedKV(3, 64, *(getattr(whole, f)[:, :2] for f in fields), whole.seq_lens)
    k, v = _kv(shape=(2, 2, 64, 64), device=device)
    half.append(k, v, backend=backend)


CASES = {
    "nan-in-k-group": (_nan_in_group, ValueError, "k contains NaN or Inf"),
    "inf-in-v-group": (_inf_in_v, ValueError, "v contains NaN or Inf"),
    "neg-inf-in-residual": (_neg_inf_in_residual, ValueError, "k contains NaN or Inf"),
    "scale-overflows-fp16": (_scale_overflow_fp16, ValueError, "scale_dtype=torch.float32"),
    "k-v-shape-mismatch": (_shape_mismatch, ValueError, "same shape"),
    "k-v-dtype-mismatch": (_dtype_mismatch, TypeError, "same dtype"),
    "int8-input": (_int_dtype, TypeError, "k must have dtype"),
    "rank-3-input": (_rank3, ValueError, "k must have 4 dimensions"),
    "head-dim-not-multiple-of-group": (_head_dim_not_multiple, ValueError, "multiple of group_size"),
    "head-dim-below-group": (_head_dim_below_group, ValueError, "multiple of group_size"),
    "bits-5": (_bits_5, ValueError, "bits must be one of"),
    "bits-str": (_bits_str, TypeError, "bits must be an int"),
    "group-size-16": (_group_16, ValueError, "group_size must be one of"),
    "scale-dtype-bf16": (_scale_bf16, TypeError, "scale_dtype"),
    "capacity-not-multiple": (_capacity_not_multiple, ValueError, "capacity must be a multiple"),
    "capacity-too-small": (_capacity_too_small, ValueError, "at least 128"),
    "seq-lens-past-s": (_seq_lens_too_long, ValueError, "seq_lens must lie in"),
    "k-not-a-tensor": (_not_a_tensor, TypeError, "k must be a torch.Tensor"),
    "backend-cuda-unsupported": (_backend_cuda, ValueError, "backend must be one of"),
    "backend-unknown": (_backend_unknown, ValueError, "backend must be one of"),
    "append-wrong-heads": (_append_wrong_heads, ValueError, "for this cache"),
    "append-wrong-dtype": (_append_wrong_dtype, TypeError, "cache's dtype"),
    "dequantize-not-a-cache": (_dequantize_not_a_cache, TypeError, "qkv must be a QuantizedKV"),
    "seq-lens-an-int": (lambda device, backend: kvbits.quantize_kv(*_kv(device=device), seq_lens=3, backend=backend),
                        TypeError, "seq_lens must be"),
    "no-heads": (lambda device, backend: kvbits.quantize_kv(*_kv(shape=(1, 0, 70, 64), device=device),
                                                             backend=backend), ValueError, "H, D >= 1"),
    "dequantize-int-dtype": (lambda device, backend: kvbits.dequantize_kv(
        kvbits.quantize_kv(*_kv(device=device), backend=backend), dtype=torch.int8), TypeError, "dtype must be"),
    "dequantize-dtype-string": (lambda device, backend: kvbits.dequantize_kv(
        kvbits.quantize_kv(*_kv(device=device), backend=backend), dtype="float16"), TypeError, "dtype must be"),
    "empty-capacity-not-multiple": (_empty_capacity_not_multiple, ValueError, "capacity must be a multiple"),
    "empty-float64": (lambda device, backend: QuantizedKV.empty(1, 2, 64, dtype=torch.float64, device=device),
                      TypeError, "dtype must be one of"),
    "empty-no-head-dim": (lambda device, backend: QuantizedKV.empty(1, 2, 0, device=device), ValueError,
                          "head_dim must be positive"),
    "reserve-a-bool": (lambda device, backend: QuantizedKV.empty(1, 2, 64, device=device).reserve(True),
                       ValueError, "capacity must be a non-negative int"),
    "reserve-a-float": (lambda device, backend: QuantizedKV.empty(1, 2, 64, device=device).reserve(40.5),
                        ValueError, "capacity must be a non-negative int"),
    "append-to-strided-cache-triton": (_append_to_strided_cache, ValueError, "qkv.k_codes must be contiguous"),
}


@pytest.mark.parametrize(("device", "backend"), device_backends())
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_rejected(record, device, backend, case):
    fn, error, text = CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter casts NaN codes before the check
        with pytest.raises(error) as info:
            fn(device, backend)
    record.backend, record.variant, record.device = backend, case, device
    record.add(error_type=type(info.value).__name__, error_message=str(info.value))
    assert text in str(info.value)


@pytest.mark.parametrize(("device", "backend"), device_backends())
def test_failed_append_leaves_cache_unchanged(record, device, backend):
    """NaN, +Inf or -Inf in a chunk's completed group, in its new residual window or in one token:
    ValueError naming k or v, and the cache as before (codes, scales and capacity included: the
    input is checked before any write). The contiguous cache reads its input on the host, so it
    refuses at once (docs/design.md section 4)."""
    g = 32
    k, v = random_kv((1, 2, 3 * g + 10, 64), torch.float16, device, seed=12)
    qkv = kvbits.quantize_kv(k[:, :, : g + 5], v[:, :, : g + 5], group_size=g, backend=backend)
    before = {f: getattr(qkv, f).clone() for f in ("k_residual", "v_residual", "seq_lens", "k_codes", "v_scale")}
    capacity = qkv.capacity
    for value in (float("nan"), float("inf"), float("-inf")):
        # in the group that completes / in the new residual window (k), one token (v)
        for name, bad in (("k", (k[:, :, g + 5:], (0, 1, g - 10, 2))), ("k", (k[:, :, g + 5:], (0, 1, g + 30, 2))),
                          ("v", (v[:, :, g + 5], (0, 1, 7)))):
            x, at = bad
            poisoned = x.clone()
            poisoned[at] = value
            kk, vv = (poisoned, v[:, :, g + 5:]) if name == "k" else (k[:, :, g + 5], poisoned)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                with pytest.raises(ValueError, match=f"{name} contains NaN or Inf") as info:
                    qkv.append(kk, vv, backend=backend)
            for field, t in before.items():
                assert torch.equal(getattr(qkv, field), t), field
            assert qkv.capacity == capacity  # nothing grown
    qkv.append(k[:, :, g + 5:], v[:, :, g + 5:], backend=backend)
    ref = kvbits.quantize_kv(k, v, group_size=g, backend="torch")
    assert torch.equal(kvbits.dequantize_kv(qkv)[0], kvbits.dequantize_kv(ref)[0])
    record.backend, record.device = backend, device
    record.add(error_type=type(info.value).__name__, error_message=str(info.value))
