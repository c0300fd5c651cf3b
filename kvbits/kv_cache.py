"""The packed low-bit KV cache: :class:`QuantizedKV`.

Layout (fixed; the fused decode kernel and the quantize kernels keep to it).
With B sequences, H kv heads, head_dim D, bits b, group size G and a token
capacity S_cap (a multiple of G)::

    k_codes   uint8 [B, H, S_cap, D*b/8]   K codes of each token, packed along D in the
                                           canonical LSB-first stream (docs/design.md section 3)
    k_scale   sdt   [B, H, S_cap/G, D]     K is quantized per channel, grouped along tokens:
    k_zero    sdt   [B, H, S_cap/G, D]     group g covers tokens [g*G, (g+1)*G)
    v_codes   uint8 [B, H, S_cap, D*b/8]   V codes, packed along D likewise
    v_scale   sdt   [B, H, S_cap, D/G]     V is quantized per token, grouped along channels:
    v_zero    sdt   [B, H, S_cap, D/G]     group j covers channels [j*G, (j+1)*G)
    k_residual  dt  [B, H, G, D]           tokens past the last full group, unquantized
    v_residual  dt  [B, H, G, D]           (the residual window, fewer than G tokens used)
    seq_lens  int32 [B]                    tokens held per sequence

``sdt`` is the scale dtype (fp16 by default, fp32 on request) and ``dt`` the
input dtype (fp16, bf16 or fp32). Token t of sequence i is in the codes when
t < (seq_lens[i] // G) * G and in the residual window at t % G otherwise.
Zero points are integers in [0, 2^b - 1] stored in ``sdt`` (exact in fp16).
Dequantization: ``x_hat = (code - zero) * scale``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import require_finite, require_int, require_same_device, resolve_backend
from .affine import (
    BACKENDS,
    INPUT_DTYPES,
    _check_config,
    _check_head_dim,
    _check_kv,
    _check_scales,
    _launch_quantize,
    _quantize_torch,
    dequantize_codes,
)
from .packing import unpack_bits


class CacheLengths:
    """What every cache arrangement derives the same way from ``k_residual``, ``k_scale``,
    ``group_size`` and ``seq_lens`` (shared by :class:`QuantizedKV` and the paged cache)."""

    @property
    def head_dim(self) -> int:
        return self.k_residual.shape[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.k_residual.dtype

    @property
    def scale_dtype(self) -> torch.dtype:
        return self.k_scale.dtype

    def quantized_lens(self) -> torch.Tensor:
        """Tokens per sequence held in packed codes (whole groups only), int32 [B]."""
        return (self.seq_lens // self.group_size) * self.group_size

    def residual_lens(self) -> torch.Tensor:
        """Tokens per sequence held in the fp residual window, int32 [B]."""
        return self.seq_lens - self.quantized_lens()


def _require_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int; got {value!r}")


def _side_tensors(side: str, batch: int, heads: int, head_dim: int, bits: int, group_size: int, capacity: int,
                  scale_dtype: torch.dtype, device, zero_from: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, scale, zero) of K (``side`` "k": scales per channel and group of G tokens) or V
    ("v": per token and group of G channels) for ``capacity`` tokens, zero from token
    ``zero_from`` on (the layout of :class:`QuantizedKV`; arguments checked by the caller)."""
    per_token, width = (group_size, head_dim) if side == "k" else (1, head_dim // group_size)

    def tokens(per: int, last: int, dtype: torch.dtype) -> torch.Tensor:
        x = torch.empty(batch, heads, capacity // per, last, dtype=dtype, device=device)
        if zero_from < capacity:  # a prompt that fills the capacity costs no call here
            x[:, :, zero_from // per:].zero_()
        return x

    return (tokens(1, head_dim * bits // 8, torch.uint8), tokens(per_token, width, scale_dtype),
            tokens(per_token, width, scale_dtype))


@dataclass
class QuantizedKV(CacheLengths):
    bits: int
    group_size: int
    k_codes: torch.Tensor
    k_scale: torch.Tensor
    k_zero: torch.Tensor
    v_codes: torch.Tensor
    v_scale: torch.Tensor
    v_zero: torch.Tensor
    k_residual: torch.Tensor
    v_residual: torch.Tensor
    seq_lens: torch.Tensor

    @property
    def batch(self) -> int:
        return self.k_codes.shape[0]

    @property
    def heads(self) -> int:
        return self.k_codes.shape[1]

    @property
    def capacity(self) -> int:
        return self.k_codes.shape[2]

    @property
    def device(self) -> torch.device:
        return self.k_codes.device

    # -- allocation ------------------------------------------------------------------
    @classmethod
    def empty(
        cls,
        batch: int,
        heads: int,
        head_dim: int,
        *,
        bits: int = 3,
        group_size: int = 64,
        capacity: int = 0,
        dtype: torch.dtype = torch.float16,
        scale_dtype: torch.dtype = torch.float16,
        device: torch.device | str = "cpu",
        zero_from: int = 0,
    ) -> QuantizedKV:
        """An empty cache (seq_lens 0) with room for ``capacity`` quantized tokens per sequence.

        ``capacity`` must be a multiple of ``group_size``; ``head_dim`` a multiple of
        ``group_size``. Codes, scales and zeros start at zero from token ``zero_from`` (a
        multiple of ``group_size``) on, and are left unset before it, for a caller that writes
        them there; the residual window starts at zero.
        """
        _check_config(bits, group_size, scale_dtype)
        _check_head_dim(head_dim, group_size)
        for name, value in (("batch", batch), ("heads", heads), ("capacity", capacity)):
            _require_count(name, value)
        if head_dim <= 0:
            raise ValueError(f"head_dim must be positive; got {head_dim}")
        if dtype not in INPUT_DTYPES:
            raise TypeError(f"dtype must be one of {INPUT_DTYPES} (the dtype of the K/V appended); got {dtype!r}")
        if capacity % group_size:
            raise ValueError(f"capacity must be a multiple of group_size={group_size}; got {capacity}")
        require_int("zero_from", zero_from)
        if zero_from < 0 or zero_from % group_size or zero_from > capacity:
            raise ValueError(f"zero_from must be a multiple of group_size={group_size} in [0, capacity={capacity}]; "
                             f"got {zero_from}")
        kw = {"device": device}
        return cls(
            bits, group_size,
            *_side_tensors("k", batch, heads, head_dim, bits, group_size, capacity, scale_dtype, device, zero_from),
            *_side_tensors("v", batch, heads, head_dim, bits, group_size, capacity, scale_dtype, device, zero_from),
            k_residual=torch.zeros(batch, heads, group_size, head_dim, dtype=dtype, **kw),
            v_residual=torch.zeros(batch, heads, group_size, head_dim, dtype=dtype, **kw),
            seq_lens=torch.zeros(batch, dtype=torch.int32, **kw),
        )

    def reserve(self, capacity: int) -> None:
        """Grow the token capacity of the codes to at least ``capacity`` (rounded up to whole
        groups), keeping every stored value; never shrinks."""
        _require_count("capacity", capacity)
        g = self.group_size
        capacity = -(-capacity // g) * g
        if capacity <= self.capacity:
            return
        for name, per_token in (
            ("k_codes", 1), ("v_codes", 1), ("v_scale", 1), ("v_zero", 1), ("k_scale", g), ("k_zero", g),
        ):
            old = getattr(self, name)
            new = torch.zeros(
                (*old.shape[:2], capacity // per_token, *old.shape[3:]), dtype=old.dtype, device=old.device
            )
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)

    # -- streaming -------------------------------------------------------------------
    def append(self, k: torch.Tensor, v: torch.Tensor, *, backend: str | None = None) -> None:
        """Append one token (k, v: [B, H, D]) or a chunk (k, v: [B, H, T, D]) to every sequence.

        Tokens go into the residual window; each time it completes a group of G tokens
        the group is quantized (K per channel, V per token) and packed into the codes,
        growing the capacity when needed (at least doubling it, so that appends copy each
        token a bounded number of times). Appending token by token stores exactly the codes,
        scales, zeros and residual tokens that :func:`kvbits.quantize_kv` stores for all
        tokens at once (the capacity beyond them may differ). Inputs must match the cache's
        dtype, heads and head_dim; the cache keeps their values, not their autograd graph.
        On bad input (NaN/Inf, shape, dtype) the cache is left as it was; a group whose
        scale overflows the scale dtype raises after its codes were written, past
        ``seq_lens`` (where nothing reads them), with ``seq_lens`` and the residual unchanged.
        """
        if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == v.dim() == 3:
            k, v = k.unsqueeze(2), v.unsqueeze(2)
        _check_kv(k, v)
        b, h, t, d = k.shape
        if (b, h, d) != (self.batch, self.heads, self.head_dim):
            raise ValueError(
                f"k and v must be [B={self.batch}, H={self.heads}, T, D={self.head_dim}] "
                f"(or [B, H, D] for one token) for this cache; got {tuple(k.shape)}"
            )
        if k.dtype != self.dtype:
            raise TypeError(f"k and v must have the cache's dtype {self.dtype}; got {k.dtype}")
        require_same_device(k=k, cache=self.k_codes)
        backend = resolve_backend(backend, k.device, ("torch", "triton"))
        seq = self.seq_lens.tolist()
        if t == 0 or b == 0:
            return
        k, v = k.detach(), v.detach()  # the cache keeps values, never an autograd graph
        rows = [slice(None)] if len(set(seq)) == 1 else [slice(i, i + 1) for i in range(b)]
        g = self.group_size
        plans = []
        for sel in rows:
            n = seq[sel.start or 0]
            q_len, r = n // g * g, n % g
            k_all = torch.cat([self.k_residual[sel, :, :r], k[sel]], dim=2)
            v_all = torch.cat([self.v_residual[sel, :, :r], v[sel]], dim=2)
            full = (r + t) // g * g
            require_finite("k", k_all)  # before anything is written
            require_finite("v", v_all)
            plans.append((sel, q_len, k_all, v_all, full))
        need = max(q_len + full for _, q_len, _, _, full in plans)
        if need > self.capacity:  # grown geometrically: appends cost amortized O(1) copies per token
            self.reserve(max(need, 2 * self.capacity))
        for sel, q_len, k_all, v_all, full in plans:
            quantize_into(self._rows(sel), k_all[:, :, :full], v_all[:, :, :full], q_len, backend)
        for sel, _, k_all, v_all, full in plans:
            rest = k_all.shape[2] - full
            self.k_residual[sel, :, :rest] = k_all[:, :, full:]
            self.v_residual[sel, :, :rest] = v_all[:, :, full:]
        self.seq_lens += t

    def _rows(self, sel: slice) -> QuantizedKV:
        """A view of the sequences in ``sel`` sharing this cache's storage."""
        return QuantizedKV(
            self.bits, self.group_size,
            *(getattr(self, f)[sel] for f in (
                "k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero", "k_residual", "v_residual",
                "seq_lens",
            )),
        )

    # -- size --------------------------------------------------------------------------
    def bytes_per_token(self) -> float:
        """Bytes one quantized token costs across all heads of one sequence: K and V codes
        (D*b/8 each) plus scales and zeros amortized (K: 2*D/G per token, V: 2*D/G)."""
        d, g = self.head_dim, self.group_size
        sdt = self.k_scale.element_size()
        return self.heads * (2 * d * self.bits / 8 + 4 * (d / g) * sdt)

    def fp16_bytes_per_token(self) -> int:
        """Bytes one token costs in a plain fp16 K/V cache of the same heads and head_dim."""
        return self.heads * 2 * self.head_dim * 2

    def compression_vs_fp16(self) -> float:
        """How many times smaller than an fp16 cache a quantized token is."""
        return self.fp16_bytes_per_token() / self.bytes_per_token()

    def nbytes(self) -> int:
        """Bytes held by every tensor of the cache (allocated capacity and residual window)."""
        return sum(
            getattr(self, f).numel() * getattr(self, f).element_size()
            for f in ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero",
                      "k_residual", "v_residual", "seq_lens")
        )

    def dequantize(self, *, dtype: torch.dtype | None = None):
        """(k_hat, v_hat) [B, H, max(seq_lens), D]; see :func:`kvbits.dequantize_kv`."""
        return dequantize_kv(self, dtype=dtype)


# ----------------------------------------------------------------------------- filling and reading a cache
def _check_seq_lens(seq_lens, batch: int, s: int) -> list[int]:
    if seq_lens is None:
        return [s] * batch
    if isinstance(seq_lens, torch.Tensor):
        if seq_lens.is_floating_point() or seq_lens.dim() != 1:
            raise TypeError(f"seq_lens must be a 1-d integer tensor or a list of ints; got {seq_lens!r}")
        seq_lens = seq_lens.tolist()
    if not isinstance(seq_lens, (list, tuple)):
        raise TypeError(f"seq_lens must be a 1-d integer tensor or a list of ints; got {type(seq_lens).__name__}")
    lens = list(seq_lens)
    if len(lens) != batch or any(isinstance(n, bool) or not isinstance(n, int) for n in lens):
        raise TypeError(f"seq_lens must hold {batch} ints (one per sequence); got {seq_lens!r}")
    if any(n < 0 or n > s for n in lens):
        raise ValueError(f"seq_lens must lie in [0, S={s}]; got {lens}")
    return lens


# ----------------------------------------------------------------------------- public API
def quantize_into(qkv: QuantizedKV, k: torch.Tensor, v: torch.Tensor, token_offset: int, backend: str) -> None:
    """Quantize whole groups k, v [B, H, T, D] (T a multiple of G) into ``qkv`` at ``token_offset``.

    Writes codes rows [token_offset, token_offset + T), K scale/zero groups
    [token_offset/G, (token_offset + T)/G) and V scale/zero rows likewise. Leaves
    ``seq_lens`` and the residual window alone. Raises ValueError (after writing)
    when a group holds NaN/Inf or its scale overflows the scale dtype (one read-back of a flag).
    """
    errors = torch.zeros(1, dtype=torch.int32, device=k.device)
    _quantize_groups(qkv, k, v, token_offset, backend, errors)
    if errors.item():
        _check_written_scales(qkv, k, v, token_offset)
        raise _flag_without_cause()


def _quantize_groups(qkv: QuantizedKV, k, v, token_offset: int, backend: str, errors: torch.Tensor) -> None:
    """quantize_into's writes, with nothing read back: ``errors`` (int32 [1]) becomes nonzero where a
    group's scale is NaN or overflows the scale dtype."""
    if k.shape[2] == 0:
        return
    if backend == "triton":
        for name in ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero"):
            if not getattr(qkv, name).is_contiguous():  # the kernel addresses them by their shapes
                raise ValueError(f"qkv.{name} must be contiguous for backend='triton' (use backend='torch')")
    for x, codes, scale, zero, per_channel in (
        (k, qkv.k_codes, qkv.k_scale, qkv.k_zero, True),
        (v, qkv.v_codes, qkv.v_scale, qkv.v_zero, False),
    ):
        _quantize_side(x, codes, scale, zero, token_offset, qkv.group_size, qkv.bits, per_channel, backend, errors)


def _quantize_side(x, codes, scale, zero, token_offset: int, g: int, bits: int, per_channel: bool, backend: str,
                   errors: torch.Tensor) -> None:
    """Whole groups x [B, H, T, D] of K (``per_channel``) or V into one side's codes, scale and zero
    (contiguous for ``backend`` "triton") at ``token_offset``; ``errors`` as _quantize_groups."""
    if backend == "triton":
        _launch_quantize(x, codes, scale, zero, token_offset, g, bits, per_channel, errors=errors)
        return
    t = x.shape[2]
    rows = slice(token_offset, token_offset + t)
    sel = slice(token_offset // g, (token_offset + t) // g) if per_channel else rows
    c, s, z = _quantize_torch(x, bits, g, scale.dtype, per_channel)
    codes[:, :, rows] = c
    scale[:, :, sel] = s
    zero[:, :, sel] = z
    _flag_non_finite(errors, s)


def _flag_non_finite(errors: torch.Tensor, x: torch.Tensor) -> None:
    """Makes ``errors`` (int32 [1]) nonzero where ``x`` holds NaN or Inf, with nothing read back."""
    errors.bitwise_or_((~torch.isfinite(x)).any().to(torch.int32))


def _check_written_scales(qkv: QuantizedKV, k, v, token_offset: int) -> None:
    """The ValueError for groups k, v written at token_offset whose scales are not finite (NaN/Inf
    in the input, or a scale overflow): the slow path, once the flag said so."""
    g, t = qkv.group_size, k.shape[2]
    _check_scales("k", k, qkv.k_scale[:, :, token_offset // g:(token_offset + t) // g])
    _check_scales("v", v, qkv.v_scale[:, :, token_offset:token_offset + t])


def _flag_without_cause() -> RuntimeError:
    return RuntimeError("quantization flagged a non-finite scale, but every scale written is finite")


def quantize_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    bits: int = 3,
    *,
    group_size: int = 64,
    scale_dtype: torch.dtype = torch.float16,
    backend: str | None = None,
    capacity: int | None = None,
    seq_lens=None,
) -> QuantizedKV:
    """Quantize K and V into a packed cache.

    k, v: fp16 / bf16 / fp32 [B, H, S, D], D a multiple of ``group_size``; any S >= 0.
    Tokens [0, (S // G) * G) are quantized (K per channel over G-token groups, V per
    token over G-channel groups) and packed; the last S % G tokens stay in the
    residual window in the input dtype. ``capacity`` (a multiple of G, at least
    ``ceil(S / G) * G``; that is the default) sets the token capacity of the codes
    for later :meth:`QuantizedKV.append` calls. ``backend``: ``"torch"`` (reference),
    ``"triton"`` (compiled on a GPU, interpreted on CPU); ``None`` picks Triton on a GPU.
    ``seq_lens`` (ints or an int tensor [B], each in [0, S]) keeps only the first
    seq_lens[i] tokens of sequence i (a ragged batch); by default every sequence holds S.
    """
    _check_kv(k, v)
    _check_config(bits, group_size, scale_dtype)
    batch, heads, s, d = k.shape
    _check_head_dim(d, group_size)
    backend = resolve_backend(backend, k.device, BACKENDS)
    need = -(-s // group_size) * group_size
    if capacity is None:
        capacity = need
    require_int("capacity", capacity)
    if capacity % group_size or capacity < need:
        raise ValueError(
            f"capacity must be a multiple of group_size={group_size} and at least {need} "
            f"(S={s} rounded up to whole groups); got {capacity}"
        )
    lens = _check_seq_lens(seq_lens, batch, s)
    rows = [slice(None)] if len(set(lens)) <= 1 else [slice(i, i + 1) for i in range(batch)]
    fulls = [(lens[sel.start or 0] if lens else 0) // group_size * group_size for sel in rows]
    whole = rows == [slice(None)] and fulls[0] > 0  # one write of the batch's groups per side
    errors = torch.zeros(1, dtype=torch.int32, device=k.device)
    sides = []
    for x, side in ((k, "k"), (v, "v")):
        # every row past the shortest quantized prefix is zeroed, the rest is written by the kernels:
        # no pass over the whole cache before they run
        tensors = _side_tensors(side, batch, heads, d, bits, group_size, capacity, scale_dtype, k.device,
                                min(fulls, default=0))
        if whole:  # launched as soon as its tensors exist: the host's work after it runs beside it
            _quantize_side(x if fulls[0] == s else x[:, :, :fulls[0]], *tensors, 0, group_size, bits, side == "k",
                           backend, errors)
        sides.append(tensors)
    qkv = QuantizedKV(
        bits, group_size, *sides[0], *sides[1],
        k_residual=torch.zeros(batch, heads, group_size, d, dtype=k.dtype, device=k.device),
        v_residual=torch.zeros(batch, heads, group_size, d, dtype=k.dtype, device=k.device),
        seq_lens=torch.zeros(batch, dtype=torch.int32, device=k.device),
    )
    for sel, full in zip(rows, fulls, strict=True):
        n = lens[sel.start or 0] if lens else 0
        if not whole:
            _quantize_groups(qkv._rows(sel), k[sel, :, :full], v[sel, :, :full], 0, backend, errors)
        if n > full:
            for x, window in ((k, qkv.k_residual), (v, qkv.v_residual)):
                window[sel, :, : n - full] = x[sel, :, full:n]
                _flag_non_finite(errors, x[sel, :, full:n])
    if errors.item():  # the one read-back: which part and why, as each part's checks say it
        for sel, full in zip(rows, fulls, strict=True):
            n = lens[sel.start or 0] if lens else 0
            require_finite("k", k[sel, :, full:n])
            require_finite("v", v[sel, :, full:n])
            _check_written_scales(qkv._rows(sel), k[sel, :, :full], v[sel, :, :full], 0)
        raise _flag_without_cause()
    if len(set(lens)) == 1:
        qkv.seq_lens.fill_(lens[0])  # no host-to-device copy
    else:
        qkv.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    return qkv


def _dequantize_side(codes, scale, zero, bits, group_size, n_tokens, per_channel):
    q = unpack_bits(codes[:, :, :n_tokens].contiguous(), bits, layout="byte", backend="torch")
    b, h, t, d = q.shape
    if per_channel:
        qg = q.reshape(b, h, t // group_size, group_size, d)
        x = dequantize_codes(qg, scale[:, :, : t // group_size, None, :], zero[:, :, : t // group_size, None, :])
    else:
        qg = q.reshape(b, h, t, d // group_size, group_size)
        x = dequantize_codes(qg, scale[:, :, :t, :, None], zero[:, :, :t, :, None])
    return x.reshape(b, h, t, d)


def dequantize_kv(qkv: QuantizedKV, *, dtype: torch.dtype | None = None):
    """Reconstruct (k_hat, v_hat), each [B, H, S, D] with S = max(seq_lens).

    Token t < quantized_lens[i] comes from the codes, ``(q - zero) * scale`` in fp32;
    tokens up to seq_lens[i] from the residual window; positions past seq_lens[i]
    are zero. Output dtype: ``dtype`` or the cache's input dtype.
    """
    if not isinstance(qkv, QuantizedKV):
        raise TypeError(f"qkv must be a QuantizedKV; got {type(qkv).__name__}")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype (or None: the cache's); got {dtype!r}")
    dtype = dtype or qkv.dtype
    seq = qkv.seq_lens.tolist()
    qlen = qkv.quantized_lens().tolist()
    s_max = max(seq, default=0)
    q_max = max(qlen, default=0)
    shape = (qkv.batch, qkv.heads, s_max, qkv.head_dim)
    outs = []
    for codes, scale, zero, residual, per_channel in (
        (qkv.k_codes, qkv.k_scale, qkv.k_zero, qkv.k_residual, True),
        (qkv.v_codes, qkv.v_scale, qkv.v_zero, qkv.v_residual, False),
    ):
        out = torch.zeros(shape, dtype=torch.float32, device=qkv.device)
        if q_max:
            x = _dequantize_side(codes, scale, zero, qkv.bits, qkv.group_size, q_max, per_channel)
        for i, (n, nq) in enumerate(zip(seq, qlen, strict=True)):
            if nq:
                out[i, :, :nq] = x[i, :, :nq]
            out[i, :, nq:n] = residual[i, :, : n - nq].float()
        outs.append(out.to(dtype))
    return outs[0], outs[1]
