"""How the fused decode's kernels are launched: the split plan, the partial buffers, every launch
argument and constexpr, and the specializations compiled ahead of time (docs/design.md section 6).

The number of splits comes from the shape (split_count): one wave of split programs, every one
resident from the start, while its splits stay within MAX_SPLIT_TILES tiles, else whole waves
(the fp-token programs, fp_parts per sequence and kv head and short, come on top).
"""

from __future__ import annotations

import torch
import triton

from .._runtime import sm_count, triton_interpreted
from ..aot import AotSpec
from .kernel import LOG2E, _decode_merge_kernel, _decode_split_kernel
from .layout import code_classes, default_layout
from .paged import PagedQuantizedKV

SPLIT_PROGRAMS_PER_SM = None  # fixed split-KV target in programs per SM (None: the wave rule, split_count)
MAX_SPLIT_TILES = 24  # the wave rule's longest split in tiles (H200: one wave of 42-tile splits loses 35% at 128K)
REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80 and sm_90)
NUM_STAGES = 2  # software-pipelining depth of the code-word loads (H200: 2 beats 3 and 4)
MAX_REGISTERS = 168  # register cap per thread (H200: 168 beats the compiler's 255 and 128; None lifts it)
MERGE_COLUMNS = 32  # channels per merge program (H200: 32 on one warp 1.7 us at 32K, 128 on four 3.7 us)
MERGE_WARPS = 1
# fp-token programs (G fp16 rows each) counted to one slot of the split plan: each ends well before
# a code split, whose slot then takes the next program (H100, 32K: B=8 Hkv=8 +4.2% over the step
# without fp tokens at 2, +6.4% at 4/3 and +9.7% at 1; B=1 H=32 +3.5% at 2, +3.2% at 4/3)
FP_PROGRAMS_PER_SLOT = 2


def _min_dot_columns() -> int:
    """The smallest N tl.dot compiles with for fp16 on NVIDIA: 16 up to triton 3.4, from 3.5 on
    any (8 is the tensor-core instruction's own N)."""
    major, minor = (int(part) for part in triton.__version__.split(".")[:2])
    return 8 if (major, minor) >= (3, 5) else 16


MIN_DOT_COLUMNS = _min_dot_columns()


def mma_columns(group: int) -> int:
    """N of the K product: each of the group's query heads twice (hi and lo columns of q * s), at
    least MIN_DOT_COLUMNS and a power of two: GQA pads by repeating heads, and one query head fills
    every slot (_q_operand). Half of it (HALF in the kernel) is the head slots of the softmax state."""
    return max(MIN_DOT_COLUMNS, 2 * triton.next_power_of_2(group))


def weight_columns(group: int) -> int:
    """N of the V product: one column per head slot (mma_columns / 2; the weights are rounded once
    to fp16, no lo column), at least MIN_DOT_COLUMNS, where each slot fills two columns
    (_head_cols)."""
    return max(MIN_DOT_COLUMNS, mma_columns(group) // 2)


def fold_rows(group: int) -> int:
    """Query heads the per-tile K-scale folding runs on (_fold_k_scales, q as [D, heads]): the one
    query head of its kv head, or for GQA every head padded by repeats to the MMA's columns."""
    return 1 if group == 1 else mma_columns(group) // 2


def scale_words(view: PagedQuantizedKV) -> bool:
    """Whether the split kernel may load its 16-bit scales and zeros as 32-bit words: each K scale
    row two channels a word, each token's two V scale groups one word. Needs 16-bit scales, two
    V groups per token, unit stride along the last dim, every row 4-byte aligned, and zeros with
    their scales' strides (the kernel addresses both with one set)."""
    def aligned(scale, zero):
        return (scale.element_size() == 2 and scale.stride(-1) == 1 and scale.stride() == zero.stride()
                and all(stride % 2 == 0 for stride in scale.stride()[:-1])
                and scale.data_ptr() % 4 == 0 and zero.data_ptr() % 4 == 0)

    return (view.v_scale.shape[-1] == 2 and aligned(view.k_scale, view.k_zero)
            and aligned(view.v_scale, view.v_zero))


def resident_programs(warps: int) -> int:
    """Split programs of ``warps`` warps one SM holds at once, as the register cap allows."""
    return max(1, REGISTER_FILE // ((MAX_REGISTERS or 255) * 32 * warps))


def split_count(pairs: int, tiles: int, slots: int) -> int:
    """Splits per (sequence, kv head) for ``pairs`` of them with ``tiles`` tiles each, on a GPU
    holding ``slots`` programs at once: one wave (every split program resident from the start)
    while its splits stay within MAX_SPLIT_TILES tiles, else the fewest whole waves whose splits
    do. Whole waves: the split programs never exceed a multiple of the slots by a few, which
    would leave those few running alone at the end (the short fp-token programs come on top:
    _split_target leaves them part of the slots)."""
    shortest = -(-tiles // MAX_SPLIT_TILES)  # fewest splits that keep each within the limit
    one_wave = slots // pairs
    if one_wave >= shortest:
        return max(1, one_wave)
    waves = -(-shortest * pairs // slots)
    return max(shortest, waves * slots // pairs)


def _split_target(pairs: int, tiles: int, warps: int, device: torch.device, parts: int) -> int:
    """Splits to aim for: split_count on a GPU (or SPLIT_PROGRAMS_PER_SM per SM when set) over the
    slots that the ``parts`` fp-token programs per pair leave, FP_PROGRAMS_PER_SLOT of them to a
    slot; a few programs in the interpreter, which pays per program."""
    if device.type != "cuda":
        return -(-4 // pairs)
    if SPLIT_PROGRAMS_PER_SM:
        return -(-SPLIT_PROGRAMS_PER_SM * sm_count(device) // pairs)
    slots = resident_programs(warps) * sm_count(device)
    return split_count(pairs, tiles, max(pairs, slots - parts // FP_PROGRAMS_PER_SLOT * pairs))


def split_plan(batch: int, kv_heads: int, max_code_len: int, block_t: int, device: torch.device,
               num_splits: int | None = None, warps: int = 1, parts: int = 1) -> tuple[int, int]:
    """(splits, tiles per split) of the batch * kv_heads (sequence, kv head) pairs' code tiles,
    beside ``parts`` fp-token programs per pair (fp_parts)."""
    tiles = -(-max_code_len // block_t)
    if tiles == 0:
        return 0, 1
    if num_splits is None:
        num_splits = _split_target(batch * kv_heads, tiles, warps, device, parts)
    num_splits = max(1, min(tiles, num_splits))
    per = -(-tiles // num_splits)
    return -(-tiles // per), per


def fp_parts(view: PagedQuantizedKV) -> int:
    """Programs per (sequence, kv head) that attend its fp tokens, a group's rows each: the sinks'
    groups and the ring's (a program over all of them would outlast the code splits)."""
    return (view.sinks + view.ring) // view.group_size


def partial_buffers(batch: int, q_heads: int, d: int, parts: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernel's outputs for ``parts`` partials (code splits and fp parts): mid_o fp32
    [B, Hq, parts, D] and mid_lse fp32 [B, Hq, parts] (NaN in the interpreter, so that a partial
    never written shows)."""
    mid_o = torch.empty(batch, q_heads, parts, d, dtype=torch.float32, device=device)
    mid_lse = torch.empty(batch, q_heads, parts, dtype=torch.float32, device=device)
    if triton_interpreted():
        mid_o.fill_(float("nan"))
        mid_lse.fill_(float("nan"))
    return mid_o, mid_lse


def query_group(q: torch.Tensor) -> tuple:
    """The split kernel's query argument: q [B, Hq, D] (unit stride along D) and its two strides."""
    return q, q.stride(0), q.stride(1)


def pool_group(view: PagedQuantizedKV) -> tuple:
    """The pool argument of the split and append kernels: ``(k_words, k_scales, v_words, v_scales,
    pages)``, each a tensor (two for the scales and zeros) with its strides over pages, heads and
    rows, and the block table with its row stride, columns and the page size (as
    _decode_split_kernel's docstring lays it out)."""
    return (
        (view.k_words, *view.k_words.stride()[:3]),
        (view.k_scale, view.k_zero, *view.k_scale.stride()[:3]),
        (view.v_words, *view.v_words.stride()[:3]),
        (view.v_scale, view.v_zero, *view.v_scale.stride()[:3]),
        (view.block_table, view.block_table.stride(0), view.block_table.shape[1], view.page_size),
    )


def fp_rows_group(view: PagedQuantizedKV) -> tuple:
    """The fp_rows argument of the split and append kernels: ``(ring, sinks)``, each the K and V
    rows and their strides over sequences, heads and rows. Without sinks the kernels touch no
    sink row: the ring stands in for their pointers."""
    kr, vr = view.k_residual, view.v_residual
    ring = (kr, vr, *kr.stride()[:3])
    sinks = (view.k_sink, view.v_sink, *view.k_sink.stride()[:3]) if view.sinks else ring
    return ring, sinks


def split_launch(view: PagedQuantizedKV, group: int, lens: torch.Tensor, cache_lens: torch.Tensor,
                 mid_o: torch.Tensor, mid_lse: torch.Tensor, sm_scale: float, splits: int, per: int):
    """(grid, arguments after the query by name, constexpr and launch options) of
    _decode_split_kernel over ``view`` for ``group`` query heads per kv head (its docstring
    tells what each argument group holds)."""
    args = dict(
        qk_scale=sm_scale * LOG2E,
        pool=pool_group(view),
        fp_rows=fp_rows_group(view),
        lengths=(lens, cache_lens),
        plan=(splits, per),
        output=((mid_o, *mid_o.stride()[:3]), (mid_lse, *mid_lse.stride()[:2])),
    )
    options = dict(
        GROUP=group, QROWS=fold_rows(group), COLS=mma_columns(group), VCOLS=weight_columns(group), D=view.head_dim,
        G=view.group_size, BITS=view.bits, CLASSES=code_classes(view.tile), SCALE_WORDS=scale_words(view),
        BLOCK_T=view.tile, SINKS=view.sinks, RING=view.ring, WARPS=view.warps, INTERPRET=triton_interpreted(),
        num_warps=view.warps, num_stages=NUM_STAGES, **({"maxnreg": MAX_REGISTERS} if MAX_REGISTERS else {}),
    )
    return (splits + fp_parts(view), view.heads, mid_o.shape[0]), args, options


def merge_launch(mid_o: torch.Tensor, mid_lse: torch.Tensor, out_strides: tuple[int, int]):
    """(grid, arguments after mid_o, mid_lse and out, constexprs) of _decode_merge_kernel writing an
    output [B, Hq, D] of strides (out_strides, 1)."""
    batch, hq, parts, d = mid_o.shape
    dm = min(d, MERGE_COLUMNS)
    args = (*mid_o.stride()[:3], *mid_lse.stride()[:2], *out_strides, parts)
    return (hq, batch, d // dm), args, dict(DM=dm, PARTS=triton.next_power_of_2(parts), num_warps=MERGE_WARPS)


# ----------------------------------------------------------------------------- AOT specializations
def pool_signature(scale_type: str) -> dict:
    """The types of pool_group's elements, named as the kernels unpack them."""
    return {
        "k_words": {"kw_ptr": "*i32", "stride_kw_p": "i64", "stride_kw_h": "i32", "stride_kw_t": "i32"},
        "k_scales": {"ks_ptr": scale_type, "kz_ptr": scale_type, "stride_ks_p": "i64", "stride_ks_h": "i32",
                     "stride_ks_g": "i32"},
        "v_words": {"vw_ptr": "*i32", "stride_vw_p": "i64", "stride_vw_h": "i32", "stride_vw_t": "i32"},
        "v_scales": {"vs_ptr": scale_type, "vz_ptr": scale_type, "stride_vs_p": "i64", "stride_vs_h": "i32",
                     "stride_vs_t": "i32"},
        "pages": {"bt_ptr": "*i32", "stride_bt_b": "i32", "table_cols": "i32", "page_size": "i32"},
    }


def fp_rows_signature(res_type: str) -> dict:
    """The types of fp_rows_group's elements, named as the kernels unpack them."""
    return {
        "ring": {"kr_ptr": res_type, "vr_ptr": res_type, "stride_r_b": "i32", "stride_r_h": "i32",
                 "stride_r_t": "i32"},
        "sinks": {"ksink_ptr": res_type, "vsink_ptr": res_type, "stride_sink_b": "i32", "stride_sink_h": "i32",
                  "stride_sink_t": "i32"},
    }


def _split_signature(q_type: str, res_type: str, scale_type: str) -> dict:
    """The split kernel's argument types, group by group (named as the kernel unpacks them)."""
    return {
        "query": {"q_ptr": q_type, "stride_qb": "i32", "stride_qh": "i32"},
        "qk_scale": "fp32",
        "pool": pool_signature(scale_type),
        "fp_rows": fp_rows_signature(res_type),
        "lengths": {"lens_ptr": "*i32", "cache_lens_ptr": "*i32"},
        "plan": {"num_splits": "i32", "tiles_per_split": "i32"},
        "output": {
            "partials": {"mid_o_ptr": "*fp32", "stride_mo_b": "i32", "stride_mo_h": "i32", "stride_mo_s": "i32"},
            "lses": {"mid_lse_ptr": "*fp32", "stride_ml_b": "i32", "stride_ml_h": "i32"},
        },
    }


# Multiples of 16 in every launch of the default layouts (D and the page size multiples of 16;
# V scale rows of D/G entries, the block table's and the lse's strides excepted): how a launch
# specializes them, so the AOT build is the kernel that runs.
_SPLIT_MULTIPLES = ("stride_qb", "stride_qh", "stride_kw_p", "stride_kw_h", "stride_kw_t", "stride_ks_p",
                    "stride_ks_h", "stride_ks_g", "stride_vw_p", "stride_vw_h", "stride_vw_t", "stride_vs_p",
                    "stride_vs_h", "stride_r_b", "stride_r_h", "stride_r_t", "stride_sink_b", "stride_sink_h",
                    "stride_sink_t", "stride_mo_b", "stride_mo_h",
                    "stride_mo_s", "page_size")


def split_spec(dtype: str = "fp16", d: int = 128, bits: int = 3, g: int = 64, group: int = 1,
               tile: int | None = None, warps: int | None = None, sinks: int = 0, window: int = 0) -> AotSpec:
    """One specialization of the split kernel (default layout for d and g; ``sinks`` and
    ``window`` fp tokens), for AOT compilation."""
    if tile is None or warps is None:
        tile, warps = default_layout(d, g)
    fp = f"_s{sinks}r{g + window}" if sinks or window else ""
    return AotSpec(
        f"decode_split_{dtype}_d{d}_b{bits}_g{g}_gqa{group}_t{tile}w{warps}{fp}", _decode_split_kernel,
        _split_signature(f"*{dtype}", f"*{dtype}", "*fp16"),
        {"GROUP": group, "QROWS": fold_rows(group), "COLS": mma_columns(group), "VCOLS": weight_columns(group),
         "D": d, "G": g, "BITS": bits,
         "CLASSES": code_classes(tile), "SCALE_WORDS": d // g == 2, "BLOCK_T": tile, "SINKS": sinks, "RING": g + window,
         "WARPS": warps, "INTERPRET": False},
        num_warps=warps, num_stages=NUM_STAGES, divisible_ints=_SPLIT_MULTIPLES, maxnreg=MAX_REGISTERS,
    )


def _aot_specs() -> list[AotSpec]:
    specs = [split_spec(**case) for case in (  # one per structurally different kernel
        {}, {"group": 8}, {"d": 64}, {"d": 256, "g": 128}, {"bits": 2}, {"bits": 4}, {"d": 64, "g": 32},
        {"dtype": "bf16", "group": 4}, {"tile": 64, "warps": 2}, {"tile": 64, "warps": 4},
        {"tile": 16, "warps": 1}, {"d": 64, "g": 32, "tile": 16, "warps": 1}, {"d": 256, "g": 64},
        {"g": 32}, {"sinks": 64, "window": 128}, {"group": 8, "sinks": 64, "window": 128},
    )]
    for dtype in ("fp16", "bf16"):
        specs.append(AotSpec(
            f"decode_merge_{dtype}_c{MERGE_COLUMNS}", _decode_merge_kernel,
            {"mid_o_ptr": "*fp32", "mid_lse_ptr": "*fp32", "out_ptr": f"*{dtype}", "stride_mo_b": "i32",
             "stride_mo_h": "i32", "stride_mo_s": "i32", "stride_ml_b": "i32", "stride_ml_h": "i32",
             "stride_ob": "i32", "stride_oh": "i32", "num_parts": "i32"},
            {"DM": MERGE_COLUMNS, "PARTS": 32}, num_warps=MERGE_WARPS,
        ))
    names = [spec.name for spec in specs]
    return [spec for i, spec in enumerate(specs) if spec.name not in names[:i]]


AOT_SPECS = _aot_specs()
