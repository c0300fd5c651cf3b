"""Bad input to the fused decode API and the cache layouts: a TypeError or ValueError that names
the argument and what was expected; nothing is silently reinterpreted."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from decode_support import random_kv, random_q

import kvbits
from kvbits.decode import decode_attention, layout, paged

# Triton runs on CUDA tensors on a GPU box and on CPU tensors in the interpreter elsewhere
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def cache():
    k, v = random_kv(2, 2, 100, 64, seed=300, device=DEVICE)
    return kvbits.quantize_kv(k, v, 3, backend="torch")


def _q(**kw):
    return random_q(2, 4, 64, seed=301, device=DEVICE, **kw)


def _cache_with(bits=3, group_size=64, dim=64):
    k, v = random_kv(1, 1, 70, dim, seed=302, device=DEVICE)
    return kvbits.quantize_kv(k, v, bits, group_size=group_size, backend="torch")


def _paged_with(c, table):
    """The cache in a pool of its own pages (two per sequence), with this block table."""
    pool = paged.paged_from_contiguous(c, 64)
    return dataclasses.replace(pool, block_table=torch.tensor(table, device=DEVICE))


def _claiming(c, n):
    """A copy of the cache whose seq_lens claim n tokens per sequence."""
    return dataclasses.replace(c, seq_lens=torch.full_like(c.seq_lens, n))


def _claiming_each(c, lens):
    """A copy of the cache whose seq_lens claim ``lens``."""
    return dataclasses.replace(c, seq_lens=torch.tensor(lens, dtype=c.seq_lens.dtype, device=DEVICE))


def _wide_fp32_scales():
    k, v = random_kv(1, 1, 70, 64, seed=303, device=DEVICE)
    return kvbits.quantize_kv(k.float(), v.float() * 1e6, 3, scale_dtype=torch.float32, backend="torch")


CASES = {
    # name: (callable(cache) -> None, exception, text the message must contain)
    "q_not_tensor": (lambda c: decode_attention([[1.0]], c), TypeError, "q must be a torch.Tensor"),
    "q_float32": (lambda c: decode_attention(_q().float(), c), TypeError, "q must have dtype"),
    "q_int": (lambda c: decode_attention(torch.ones(2, 4, 64, dtype=torch.int32, device=DEVICE), c), TypeError,
              "q must have dtype"),
    "q_rank2": (lambda c: decode_attention(_q()[0], c), ValueError, "q must have 3 dimensions"),
    "cache_wrong_type": (lambda c: decode_attention(_q(), {"k": 1}), TypeError, "cache must be"),
    "batch_mismatch": (lambda c: decode_attention(random_q(3, 4, 64, device=DEVICE), c), ValueError, "batch"),
    "head_dim_mismatch": (lambda c: decode_attention(random_q(2, 4, 128, device=DEVICE), c), ValueError,
                          "head_dim"),
    "head_ratio": (lambda c: decode_attention(random_q(2, 3, 64, device=DEVICE), c), ValueError,
                   "multiple of the cache's kv heads"),
    "device_mismatch": (lambda c: decode_attention(_q().to("meta"), c), ValueError, "device"),
    "seq_lens_float": (lambda c: decode_attention(_q(), c, seq_lens=torch.ones(2, device=DEVICE)), TypeError,
                       "seq_lens"),
    "seq_lens_shape": (lambda c: decode_attention(_q(), c, seq_lens=torch.ones(3, dtype=torch.int32, device=DEVICE)),
                       ValueError, "seq_lens must have shape [2]"),
    "seq_lens_zero": (lambda c: decode_attention(_q(), c, seq_lens=torch.tensor([0, 5], dtype=torch.int32,
                                                                                  device=DEVICE)),
                      ValueError, "seq_lens[0] = 0"),
    "empty_sequence": (lambda c: decode_attention(_q(), _claiming_each(c, [100, 0]), backend="torch"), ValueError,
                       "sequence 1 of the cache is empty (cache.seq_lens[1] = 0): it holds no token to attend"),
    "empty_sequence_triton": (lambda c: decode_attention(_q(), _claiming_each(c, [0, 100]), backend="triton"),
                              ValueError, "sequence 0 of the cache is empty (cache.seq_lens[0] = 0)"),
    "empty_sequence_seq_lens": (lambda c: decode_attention(_q(), _claiming_each(c, [0, 100]),
                                                           seq_lens=torch.tensor([1, 5], device=DEVICE)),
                                ValueError, "sequence 0 of the cache is empty"),
    "seq_lens_too_long": (lambda c: decode_attention(_q(), c, seq_lens=torch.tensor([5, 101], device=DEVICE)),
                          ValueError,
                          "seq_lens[1] = 101 must be in [1, 100] (the tokens the cache holds for sequence 1)"),
    "sm_scale_negative": (lambda c: decode_attention(_q(), c, sm_scale=-1.0), ValueError, "sm_scale"),
    "sm_scale_nan": (lambda c: decode_attention(_q(), c, sm_scale=float("nan")), ValueError, "sm_scale"),
    "sm_scale_string": (lambda c: decode_attention(_q(), c, sm_scale="0.1"), TypeError, "sm_scale"),
    "backend_unknown": (lambda c: decode_attention(_q(), c, backend="numpy"), ValueError, "backend"),
    "backend_cuda": (lambda c: decode_attention(_q(), c, backend="cuda"), ValueError, "backend"),
    "num_splits_zero": (lambda c: decode_attention(_q(), c, backend="triton", num_splits=0), ValueError,
                        "num_splits"),
    "sm_scale_overflows_fp32": (lambda c: decode_attention(_q(), c, sm_scale=1e300), ValueError, "sm_scale"),
    "sm_scale_int_beyond_float": (lambda c: decode_attention(_q(), c, sm_scale=10**400), ValueError, "sm_scale"),
    "num_splits_zero_torch": (lambda c: decode_attention(_q(), c, backend="torch", num_splits=0), ValueError,
                              "num_splits"),
    "block_table_past_pool": (lambda c: decode_attention(_q(), _paged_with(c, [[0, 1], [7, 3]]), backend="triton"),
                              ValueError, "cache.block_table[1, 0] = 7 is not a page of the pool"),
    "block_table_past_pool_torch": (lambda c: decode_attention(_q(), _paged_with(c, [[0, 1], [7, 3]]),
                                                               backend="torch"),
                                    ValueError, "cache.block_table[1, 0] = 7 is not a page of the pool"),
    "block_table_negative": (lambda c: decode_attention(_q(), _paged_with(c, [[-1, 1], [2, 3]]), backend="triton"),
                             ValueError, "cache.block_table[0, 0] = -1"),
    "block_table_float": (lambda c: decode_attention(_q(), _paged_with(c, [[0.0, 1.0], [2.0, 3.0]])), TypeError,
                          "cache.block_table must have dtype"),
    "cache_seq_lens_past_capacity": (lambda c: decode_attention(_q(), _claiming(c, 200), backend="triton"),
                                     ValueError, "cache.seq_lens[0] = 200 exceeds what the cache holds"),
    "cache_seq_lens_past_capacity_torch": (lambda c: decode_attention(_q(), _claiming(c, 200), backend="torch"),
                                           ValueError, "cache.seq_lens[0] = 200 exceeds what the cache holds"),
    "fp32_scales_beyond_fp16": (lambda c: decode_attention(random_q(1, 1, 64, device=DEVICE), _wide_fp32_scales(),
                                                           backend="triton"),
                                ValueError, "cache.v_scale holds scales up to"),
    "out_wrong_shape": (lambda c: decode_attention(_q(), c, out=torch.empty(2, 4, 32, dtype=torch.float16,
                                                                            device=DEVICE)),
                        ValueError, "out must match q"),
    "bits8_triton": (lambda c: decode_attention(random_q(1, 1, 64, device=DEVICE), _cache_with(bits=8),
                                                backend="triton"), ValueError, "bits"),
    "eight_v_groups_triton": (lambda c: decode_attention(random_q(1, 1, 256, device=DEVICE),
                                                         _cache_with(group_size=32, dim=256), backend="triton"),
                              ValueError, "group_size"),
    "page_size_not_multiple": (lambda c: paged.paged_from_contiguous(c, 96), ValueError, "page_size"),
    "pool_too_small": (lambda c: paged.paged_from_contiguous(c, 64, num_pages=3), ValueError, "num_pages"),
    "tile_over_group": (lambda c: paged.decode_view(_cache_with(group_size=32), tile=64, warps=4), ValueError,
                        "tile"),
    "layout_unserved": (lambda c: paged.decode_view(c, tile=16, warps=4), ValueError, "warps"),
    "paged_wrong_type": (lambda c: paged.paged_to_contiguous(c), TypeError, "PagedQuantizedKV"),
    "words_unknown_role": (lambda c: layout.words_from_codes(c.k_codes[:, :, :64], 3, "x"), ValueError,
                           "role must be one of"),
    "words_tile_not_served": (lambda c: layout.words_from_codes(c.k_codes[:, :, :96], 3, "k", tile=48), ValueError,
                              "tile and warps must be in"),
    "words_rows_not_whole_tiles": (lambda c: layout.words_from_codes(c.k_codes[:, :, :96], 3, "k"), ValueError,
                                   "T a multiple of tile=64"),
    "codes_from_words_wrong_width": (lambda c: layout.codes_from_words(
        torch.zeros(1, 1, 1, 100, dtype=torch.int32, device=DEVICE), 3, "k", 64),
        ValueError, "words must be [..., T/tile, "),
    "codes_from_words_float": (lambda c: layout.codes_from_words(
        torch.zeros(1, 1, 1, 384, dtype=torch.float32, device=DEVICE), 3, "k", 64),
        TypeError, "words must have dtype int32"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(record, cache, name):
    call, exc, text = CASES[name]
    record.backend, record.device, record.variant = "triton", DEVICE, "bad-input"
    with pytest.raises((TypeError, ValueError)) as info:
        call(cache)
    record.add(error_type=type(info.value).__name__, error_message=str(info.value)[:300])
    assert isinstance(info.value, exc), f"expected {exc.__name__}, got {type(info.value).__name__}: {info.value}"
    assert text in str(info.value)


def _decodes_as_the_reference(record, q, cache_or_pool, cache):
    out = decode_attention(q, cache_or_pool, backend="triton")
    ref = kvbits.decode.reference_decode(q, cache)
    err = float((out.double() - ref).abs().max())
    record.backend, record.device, record.variant = "triton", DEVICE, "bad-input"
    record.add(max_abs_err=err, states_checked=out.numel())
    assert err <= 2e-3


def test_good_input_after_bad(record, cache):
    """The checks reject without side effects: the same cache still decodes."""
    _decodes_as_the_reference(record, _q(), cache, cache)


def test_block_table_entries_past_a_sequence_are_never_read(record, cache):
    """Entries past the pages a sequence's length reaches may hold anything (a pool's padding):
    sequence 1 holds 100 tokens, one page of codes, so its second entry is not a page at all."""
    _decodes_as_the_reference(record, _q(), _paged_with(cache, [[0, 1], [2, -1]]), cache)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_query_that_is_not_finite_gives_nan_as_sdpa_does(record, cache, backend, value):
    """q's values are not inspected (docs/design.md section 4): NaN or Inf in one sequence's query
    gives NaN in that sequence's output, as scaled_dot_product_attention does; the other sequence's
    output stays finite."""
    record.backend, record.device, record.variant = backend, DEVICE, "query-not-finite"
    q = _q()
    q[0, 1, 5] = value
    out = decode_attention(q, cache, backend=backend)
    k_hat, v_hat = kvbits.dequantize_kv(cache, dtype=q.dtype)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q[0, :, None].float(), k_hat[0].float().repeat_interleave(2, 0), v_hat[0].float().repeat_interleave(2, 0))
    assert bool(torch.isnan(out[0, 1]).all()) and bool(torch.isnan(sdpa[1]).all())
    assert bool(torch.isfinite(out[1]).all())
    record.add(states_checked=out.numel())
