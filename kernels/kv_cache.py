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

from dataclasses import dataclass, field

import torch


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
    # bumped by the cache's own writes (append, reserve, quantize_into): what tells a decode
    # arrangement built from tensors with no version counter (torch.inference_mode) to rebuild
    generation: int = field(default=0, repr=False, compare=False)

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
    ) -> QuantizedKV:
        """An empty cache (seq_lens 0) with room for ``capacity`` quantized tokens per sequence.

        ``capacity`` must be a multiple of ``group_size``; ``head_dim`` a multiple of
        ``group_size``. Codes, scales and zeros start at zero; the residual window too.
        """
        from .affine import INPUT_DTYPES, _check_config, _check_head_dim

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
        row = head_dim * bits // 8
        kw = {"device": device}
        return cls(
            bits=bits,
            group_size=group_size,
            k_codes=torch.zeros(batch, heads, capacity, row, dtype=torch.uint8, **kw),
            k_scale=torch.zeros(batch, heads, capacity // group_size, head_dim, dtype=scale_dtype, **kw),
            k_zero=torch.zeros(batch, heads, capacity // group_size, head_dim, dtype=scale_dtype, **kw),
            v_codes=torch.zeros(batch, heads, capacity, row, dtype=torch.uint8, **kw),
            v_scale=torch.zeros(batch, heads, capacity, head_dim // group_size, dtype=scale_dtype, **kw),
            v_zero=torch.zeros(batch, heads, capacity, head_dim // group_size, dtype=scale_dtype, **kw),
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
        self.generation += 1
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
        scales, zeros and residual tokens that :func:`kernels.quantize_kv` stores for all
        tokens at once (the capacity beyond them may differ). Inputs must match the cache's
        dtype, heads and head_dim; the cache keeps their values, not their autograd graph.
        On bad input (NaN/Inf, shape, dtype) the cache is left as it was; a group whose
        scale overflows the scale dtype raises after its codes were written, past
        ``seq_lens`` (where nothing reads them), with ``seq_lens`` and the residual unchanged.
        """
        from ._checks import require_finite, require_same_device, resolve_backend
        from .affine import _check_kv, quantize_into

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
        if any(full for *_, full in plans):  # codes written (the residual window alone is no change)
            self.generation += 1
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
        """(k_hat, v_hat) [B, H, max(seq_lens), D]; see :func:`kernels.dequantize_kv`."""
        from .affine import dequantize_kv

        return dequantize_kv(self, dtype=dtype)
