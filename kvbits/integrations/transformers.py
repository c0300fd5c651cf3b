"""Generate with a Hugging Face transformers model on the packed KV cache.

Three lines::

    import kvbits.integrations.transformers as kvbits   # registers attn_implementation "kvbits"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvbits")
    out = model.generate(**inputs, past_key_values=kvbits.KVBitsCache(model.config, max_cache_len=4096))

:class:`KVBitsCache` is a transformers ``Cache`` holding one
:class:`~kvbits.decode.cache.PagedKVCache` per layer (one sequence per batch row), made at the
prompt's step. The attention registered as ``"kvbits"`` (:func:`kvbits_attention`) runs exact
attention (transformers' SDPA, with the model's causal and padding mask) over the prompt's own
K/V while it quantizes the prompt into the cache, then the fused decode for every single-token
step: the token is appended, then the cache attends.

How the attention reaches its layer's cache: ``Cache.update`` (which the model calls with the
step's K/V just before its attention function) returns a :class:`KVBitsStep` as both keys and
values, and the model hands those to the attention function untouched (Llama-style models
do). Nothing global maps models or layers to caches.

Padding: only each row's real tokens (those its attention mask keeps) are stored, so pads are
never attended; every token after the prompt is a real one (``generate`` extends the mask with
ones; a step whose new token is masked is refused).

Greedy or sampled decoding with every step replayed from one captured CUDA graph: ``generate_graphed`` in
:mod:`kvbits.integrations.graph_generate`.

Not served (clear ``ValueError``/``TypeError``): encoder-decoder models, layers other than full
attention (sliding window, chunked, linear), head_dim not a multiple of group_size, a
multi-token step after the prompt (assisted or chunked decoding, a second ``generate`` on the
same cache without :meth:`KVBitsCache.reset`), anything that reorders, crops or repeats the
cache (beam search, contrastive search), dropout.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import AttentionInterface, PreTrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .._checks import require_int
from ..affine import GROUP_SIZES
from ..decode.cache import BACKENDS, PagedKVCache
from ..decode.layout import DECODE_BITS

ATTENTION_NAME = "kvbits"
CACHE_DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """What every layer's pool is made with (KVBitsCache's arguments, checked)."""

    max_cache_len: int
    bits: int
    group_size: int
    page_size: int
    dtype: torch.dtype | None
    backend: str | None
    sinks: int
    window: int


class KVBitsStep:
    """One step's K/V [B, H, T, D] on their way from ``Cache.update`` to :func:`kvbits_attention`,
    with the layer that will store them. Anything else that reads it as a tensor gets a TypeError
    saying which attention it needs."""

    __slots__ = ("layer", "keys", "values")

    def __init__(self, layer: KVBitsLayer, keys: torch.Tensor, values: torch.Tensor):
        self.layer, self.keys, self.values = layer, keys, values

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)  # Python's protocols (copy, pickle, hasattr probes) see a plain object
        raise TypeError(f"a KVBitsCache's keys and values are read by the {ATTENTION_NAME!r} attention only "
                        f"(load the model with attn_implementation={ATTENTION_NAME!r}); this attention asked for "
                        f"their .{name}")


class KVBitsLayer(CacheLayerMixin):
    """One decoder layer's cache: a :class:`PagedKVCache` of B sequences, made at the prompt's
    step, and the positions seen so far (padding included, as transformers counts them)."""

    is_compileable = False  # host bookkeeping on every step
    is_croppable = False
    is_sliding = False

    def __init__(self, index: int, settings: _Settings):
        super().__init__()
        self.index, self.settings = index, settings
        self.paged: PagedKVCache | None = None
        self.seen = 0
        self._unattended = False  # update() handed out a step that no kvbits attention has stored yet

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Check a step's K/V [B, H, T, D] and return them as (step, step) for
        :func:`kvbits_attention`, which stores them (it has the padding mask; this does not)."""
        if self._unattended:
            raise ValueError(f"layer {self.index}'s previous keys were never attended: a KVBitsCache needs the model "
                             f"loaded with attn_implementation={ATTENTION_NAME!r}")
        _check_states(key_states, value_states)
        tokens = key_states.shape[2]
        if self.seen and tokens != 1:
            raise ValueError(f"a step of {tokens} tokens after the prompt: the kvbits cache decodes one token per step "
                             f"(assisted, speculative or chunked decoding, or a second generate on the same cache "
                             f"without reset(), are not served)")
        if self.seen + tokens > self.settings.max_cache_len:
            raise ValueError(f"{self.seen + tokens} positions exceed max_cache_len={self.settings.max_cache_len} of "
                             f"the KVBitsCache (its pool was sized for that many)")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._unattended = True
        step = KVBitsStep(self, key_states, value_states)
        return step, step

    def attend(self, module: torch.nn.Module, query: torch.Tensor, step: KVBitsStep,
               attention_mask: torch.Tensor | None, scaling: float | None, **kwargs) -> torch.Tensor:
        """Store the step and attend: the prompt (no cache yet) by exact SDPA, a token by the fused
        decode. query [B, Hq, T, D]; returns [B, T, Hq, D] in query's dtype."""
        self._unattended = False
        if self.paged is None:
            out = self._prefill(module, query, step, attention_mask, scaling, kwargs)
        else:
            out = self._decode(query, step, attention_mask, scaling)
        self.seen += step.keys.shape[2]
        return out

    def _prefill(self, module, query, step: KVBitsStep, attention_mask, scaling, kwargs) -> torch.Tensor:
        keys, values = step.keys, step.values
        batch, heads, tokens, head_dim = keys.shape
        out, _ = sdpa_attention_forward(module, query, keys, values, attention_mask, scaling=scaling, **kwargs)
        s = self.settings
        dtype = s.dtype or (keys.dtype if keys.dtype in CACHE_DTYPES else torch.float16)
        pages = -(-s.max_cache_len // s.page_size)
        paged = PagedKVCache(num_pages=batch * pages, page_size=s.page_size, heads=heads, head_dim=head_dim,
                             max_seqs=batch, max_pages_per_seq=pages, bits=s.bits, group_size=s.group_size,
                             dtype=dtype, device=keys.device, sinks=s.sinks, window=s.window)
        kept = _kept_tokens(attention_mask, batch, tokens)
        for row in range(batch):  # row order: the cache's rows follow the batch's
            k, v = keys[row], values[row]
            if kept is not None:
                k, v = k[:, kept[row]], v[:, kept[row]]  # the row's real tokens only: pads are never stored
            if k.shape[1] == 0:
                paged.add_sequence(backend=s.backend)
            else:
                paged.add_sequence(k.to(dtype), v.to(dtype), backend=s.backend)
        self.paged = paged
        return out

    def _decode(self, query, step: KVBitsStep, attention_mask, scaling) -> torch.Tensor:
        paged = self.paged
        if query.shape[0] != len(paged.sequences):
            raise ValueError(f"a batch of {query.shape[0]} rows for a cache of {len(paged.sequences)} sequences")
        capturing = query.is_cuda and torch.cuda.is_current_stream_capturing()
        if self.index == 0 and not capturing:  # the same mask for every layer: checked once per step (a read
            _check_decode_mask(attention_mask, query.shape[0], self.seen + 1)  # of the device, not capturable)
        dtype = paged.dtype
        paged.append(step.keys[:, :, 0].to(dtype), step.values[:, :, 0].to(dtype), backend=self.settings.backend)
        out = paged.attend(query[:, :, 0].to(dtype).contiguous(), sm_scale=scaling, backend=self.settings.backend)
        return out.to(query.dtype).unsqueeze(1)  # [B, Hq, D] -> [B, 1, Hq, D], transformers' layout

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return self.settings.max_cache_len

    def reset(self) -> None:
        """Drop the pool (the next step is a prompt again)."""
        self.paged, self.seen, self._unattended = None, 0, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise ValueError("beam search reorders the cache's rows, which the kvbits cache does not do "
                         "(use greedy or sampling: num_beams=1)")

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:  # crop(0) is generate's no-op between steps
            raise ValueError(f"crop({tokens_to_remove}): the kvbits cache cannot remove stored tokens "
                             f"(assisted or speculative decoding is not served)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise ValueError("batch_repeat_interleave: the kvbits cache cannot repeat its rows (contrastive search "
                         "and expanding a prefilled cache are not served)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise ValueError("batch_select_indices: the kvbits cache cannot select rows (contrastive search is not served)")

    def offload(self):
        raise ValueError("the kvbits cache does not offload")

    prefetch = offload


class KVBitsCache(Cache):
    """A transformers ``Cache`` for decoder-only models with full attention in every layer, each
    layer a :class:`~kvbits.decode.cache.PagedKVCache` (made at the prompt's step, one sequence
    per batch row) read by the ``"kvbits"`` attention (:func:`kvbits_attention`).

    config: the model's ``PreTrainedConfig``. max_cache_len: positions per row the pools hold
    (prompt with its padding plus new tokens; ``generate``'s max_length). bits (2, 3, 4) and
    group_size (32, 64, 128; head_dim must be a multiple of it): the quantization. page_size:
    tokens per page (a multiple of group_size; default 4 group sizes). dtype: the cache's
    K/V and q dtype, float16 or bfloat16; None takes the model's, and float16 for a float32
    model (its K/V, q and the decode's output are converted; the prompt's attention stays in
    float32). backend: "torch" or "triton" for appends and the decode, None as PagedKVCache
    picks (the fused kernel on a GPU, torch on CPU).

    Full-precision tokens (PagedKVCache's ``sinks`` and ``window``): each row's first ``sinks``
    positions and its newest ones (the partial group and the ``window`` positions before it) are
    attended in the cache's dtype, the rest from codes; multiples of group_size, by default 64
    and 128 rounded up to whole groups (``sinks=0, window=0``: only the partial group). The
    window plays the part of QuantizedCache's ``residual_length``, though the codes of every
    complete group are stored at once.
    """

    def __init__(self, config: PreTrainedConfig, *, max_cache_len: int, bits: int = 3, group_size: int = 64,
                 page_size: int | None = None, dtype: torch.dtype | None = None, backend: str | None = None,
                 sinks: int | None = None, window: int | None = None):
        head_dim, layers = _served_layers(config)
        require_int("max_cache_len", max_cache_len)
        if max_cache_len <= 0:
            raise ValueError(f"max_cache_len must be positive; got {max_cache_len}")
        require_int("bits", bits, DECODE_BITS)
        require_int("group_size", group_size, GROUP_SIZES)
        if head_dim % group_size:
            raise ValueError(f"the model's head_dim ({head_dim}) must be a multiple of group_size ({group_size}): "
                             f"V is quantized in groups of group_size channels")
        page_size = 4 * group_size if page_size is None else require_int("page_size", page_size)
        if dtype is not None and dtype not in CACHE_DTYPES:
            raise TypeError(f"dtype must be None or one of {CACHE_DTYPES}; got {dtype!r}")
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"backend must be None or one of {BACKENDS}; got {backend!r}")
        # a one-page pool runs the pool's own checks (page size against the tile, the decode's
        # arrangement for head_dim) now rather than at the prompt's step
        probe = PagedKVCache(num_pages=1, page_size=page_size, heads=1, head_dim=head_dim, max_seqs=1, bits=bits,
                             group_size=group_size, dtype=dtype or torch.float16, sinks=sinks, window=window)
        settings = _Settings(max_cache_len, bits, group_size, page_size, dtype, backend, probe.sinks, probe.window)
        super().__init__(layers=[KVBitsLayer(i, settings) for i in range(layers)])

    def nbytes(self) -> int:
        """Device bytes of every layer's pool (0 before the prompt's step)."""
        return sum(layer.paged.nbytes() for layer in self.layers if layer.paged is not None)

    def check_errors(self) -> None:
        """Raise ValueError for what appends found on the device in any layer (PagedKVCache.check_errors:
        one synchronization per layer)."""
        for layer in self.layers:
            if layer.paged is not None:
                layer.paged.check_errors()


def _served_layers(config) -> tuple[int, int]:
    """(head_dim, number of layers) of a decoder-only model whose layers all use full attention;
    TypeError or ValueError naming what else it is."""
    if not isinstance(config, PreTrainedConfig):
        raise TypeError(f"config must be a transformers PreTrainedConfig (model.config); got {type(config).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{type(config).__name__} is an encoder-decoder model: the kvbits cache serves decoder-only "
                         f"models (its cross-attention has no single-token steps)")
    text = config.get_text_config(decoder=True)
    layer_types, _ = get_layer_types_and_kwargs(text)
    others = sorted(set(layer_types) - {"full_attention"})
    if others:
        raise ValueError(f"the model has {others} layers: the kvbits cache serves full attention only (a sliding "
                         f"window or chunk would need tokens dropped from the packed pages)")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return head_dim, len(layer_types)


def _check_states(keys, values) -> None:
    for name, x in (("key_states", keys), ("value_states", values)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor [B, H, T, D]; got "
                            f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if keys.shape != values.shape:
        raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must have the same shape "
                         f"(the cache stores K and V of one head_dim)")
    if keys.shape[2] == 0:
        raise ValueError("a step with no tokens")


def _kept_tokens(mask: torch.Tensor | None, batch: int, tokens: int) -> torch.Tensor | None:
    """Which of the prompt's positions each row attends to, bool [B, T] on the mask's device, from the 4D
    boolean mask [B, 1, T, T] (None when no row has padding). The last query row of a causal
    mask sees every earlier position, so it is exactly the padding mask."""
    if mask is None:
        return None
    _check_mask(mask, batch, tokens, tokens)
    return mask[:, 0, -1]


def _check_decode_mask(mask: torch.Tensor | None, batch: int, positions: int) -> None:
    """The step's mask [B, 1, 1, positions] must let every row see its new token (the last position)."""
    if mask is None:
        return
    _check_mask(mask, batch, 1, positions)
    if not bool(mask[:, 0, 0, -1].all()):
        raise ValueError("the attention mask masks a row's new token: after the prompt every token is stored, so a "
                         "masked one would be attended (extend the mask with ones, as generate does)")


def _check_mask(mask, batch: int, queries: int, positions: int) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"the kvbits attention reads a boolean attention mask (transformers' sdpa_mask, registered "
                        f"for {ATTENTION_NAME!r}); got {mask.dtype if isinstance(mask, torch.Tensor) else type(mask)}")
    if tuple(mask.shape) != (batch, 1, queries, positions):
        raise ValueError(f"attention mask must be [B={batch}, 1, {queries}, {positions}]; got {tuple(mask.shape)}")


def kvbits_attention(module: torch.nn.Module, query: torch.Tensor, key, value, attention_mask: torch.Tensor | None,
                     scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """The ``"kvbits"`` attention function: query [B, Hq, T, D] against the step that
    :meth:`KVBitsLayer.update` returned as key and value. Returns ([B, T, Hq, D] in query's
    dtype, None): no attention weights."""
    if not isinstance(key, KVBitsStep) or value is not key:
        raise TypeError(f"the {ATTENTION_NAME!r} attention needs a KVBitsCache as past_key_values (generate(..., "
                        f"past_key_values=KVBitsCache(model.config, max_cache_len=...))); got keys of type "
                        f"{type(key).__name__} (no cache, use_cache=False or another cache)")
    if dropout:
        raise ValueError(f"dropout={dropout}: the {ATTENTION_NAME!r} attention is for inference (model.eval())")
    return key.layer.attend(module, query, key, attention_mask, scaling, **kwargs), None


def register(name: str = ATTENTION_NAME) -> None:
    """Register :func:`kvbits_attention` under ``name`` in transformers' attention interface, and
    transformers' SDPA mask for it (without a mask function a custom attention gets no mask, and
    the padding would be lost). Importing this module registers ``"kvbits"``."""
    AttentionInterface.register(name, kvbits_attention)
    AttentionMaskInterface.register(name, sdpa_mask)


register()
