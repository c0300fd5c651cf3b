"""Generation whose decode steps replay one captured CUDA graph: the model's whole forward (every
layer's append and attention with it), the pick of the next token (greedy, or a draw with
``generate``'s temperature, top-k and top-p) and the move to the next position,
with no host work per token but the replay::

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvbits")
    cache = KVBitsCache(model.config, max_cache_len=prompt_len + 64)
    sequences = generate_graphed(model, input_ids, attention_mask, cache=cache, max_new_tokens=64)

The cache is a :class:`~kvbits.integrations.transformers.KVBitsCache` (the model loaded with
``attn_implementation="kvbits"``) or transformers' own ``StaticCache`` (with ``"sdpa"``), so that
the packed cache's loop and the bf16 cache's run the same way.

The prompt's step runs eagerly. The cache then prepares for the tokens to come (a KVBitsCache's
pools reserve their pages and decode plans; a StaticCache's slots are preallocated), one decode
step runs eagerly on static buffers (the token, its positions, for a StaticCache the mask over its
slots) as the warm-up, the same step is captured, and the graph is replayed for each further
token. transformers' ``generate`` is not used: its per-step host work (masks, positions, stopping
criteria, the draw's checks of its probabilities) is what the graph leaves out. A KVBitsCache's decode steps pass no
attention mask (each row's cache holds its real tokens only, so the fused decode needs none); a
StaticCache's pass a boolean mask over its slots [B, 1, 1, max_cache_len], the prompt's real
tokens and each new one set. Position ids count each row's real tokens, as ``generate`` does with
left padding.

Greedy or sampling, as ``generate``'s ``do_sample``, the settings left unset taken from the
model's generation config as ``generate`` takes them; a draw replayed from the graph comes from
torch's default generator as an eager one does (each replay advances the generator's offset), so a
seed gives ``generate``'s draws. With an eos id a row that emits it is given the pad id from then
on and the loop stops once every row has (one read of the device per step, as ``generate`` reads
its stopping flag); without one, exactly ``max_new_tokens`` tokens. On a
device without CUDA graphs (CPU), and for a KVBitsCache with ``backend="torch"`` (whose appends
read lengths on the host), the same steps run eagerly, one forward each.
"""

from __future__ import annotations

from collections import deque
from contextlib import nullcontext

import torch
from transformers import StaticCache

from .._checks import require_int, require_tensor
from .next_token import EosStop, TokenPicker, generation_settings
from .transformers import ATTENTION_NAME, KVBitsCache

STATIC_ATTENTION = "sdpa"  # the attention a StaticCache is replayed with: it reads a boolean 4D mask


def generate_graphed(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cache: KVBitsCache | StaticCache, max_new_tokens: int, do_sample: bool | None = None,
                     temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                     eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None,
                     return_logits: bool = False, streamer=None):
    """Greedy decoding (or sampling) of ``max_new_tokens`` tokens after ``input_ids`` [B, S] (int64; left-padded
    rows with ``attention_mask`` [B, S], 1 for a real token, every row's last column real) with
    ``model`` on ``cache``: a fresh KVBitsCache (model loaded with ``attn_implementation="kvbits"``)
    or StaticCache (``"sdpa"``) for S + max_new_tokens positions. Each of ``do_sample``,
    ``temperature``, ``top_k``, ``top_p``, ``eos_token_id`` and ``pad_token_id`` left None is taken
    as ``generate`` takes it: from ``model.generation_config``, else transformers' default (top_k
    50); settings asking for another generation mode (beams, contrastive search, ...) or a logits
    processor not applied here (repetition penalty, min_p, ...) are refused with a ValueError.
    ``do_sample`` draws each token as ``generate`` does with the same ``temperature``, ``top_k``
    and ``top_p``, from torch's default generator, so that
    ``torch.manual_seed`` before either call gives the same draws. ``eos_token_id`` (one id or a
    list): a row that emits one is finished, its later tokens ``pad_token_id`` (default: the first
    eos id), and decoding stops once every row is, as ``generate`` does. Returns the sequences
    [B, S + N] (N new tokens: max_new_tokens, or fewer when every row finished), and with
    ``return_logits`` also each new token's logits [B, N, V] (float32). The cache holds S + N - 1
    positions afterwards, as after ``generate``, also when the replays stop on an exception (from
    the streamer, or an interrupt).
    ``streamer``: as ``generate``'s: ``put`` with the prompt (on the CPU), then with each new token
    (CPU, [B]), then ``end``; a replayed token is put once the next replay is queued, so that the
    device does not wait on the streamer."""
    target = _target(model, cache)
    _check(target, input_ids, attention_mask, max_new_tokens)
    settings = generation_settings(model, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                                   eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    pick = TokenPicker.resolved(settings, input_ids.device)
    stop = EosStop.make(settings["eos_token_id"], settings["pad_token_id"], input_ids)
    puts = _Puts(streamer)
    puts.now(input_ids)
    batch, prompt = input_ids.shape
    # the side stream, the graph and the streamer's events belong to the current CUDA device
    on_device = torch.cuda.device(input_ids.device) if input_ids.device.type == "cuda" else nullcontext()
    with torch.no_grad(), on_device:
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=_prompt_positions(attention_mask, batch, prompt, input_ids.device),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].float()
        tokens, kept = [pick(logits)], [logits.clone()] if return_logits else None
        if stop is not None:
            stop.pick(tokens[0])
        puts.now(tokens[0][:, 0])
        if max_new_tokens > 1 and not (stop is not None and stop.all_finished()):
            _decode(model, target, tokens, kept, attention_mask, prompt, max_new_tokens - 1, logits, pick, puts,
                    stop)
    target.check_errors()
    pick.check_errors()
    puts.end()
    sequences = torch.cat([input_ids, *tokens], dim=1)
    return (sequences, torch.stack(kept, dim=1)) if return_logits else sequences


class _KVBitsTarget:
    """What the loop needs of a KVBitsCache: pages and plans reserved before the warm-up, the
    host's counts set after the replays (the host saw the capture, in which nothing ran, and none
    of the replays)."""

    attention = ATTENTION_NAME

    def __init__(self, cache: KVBitsCache):
        self.cache = cache
        self.capacity = cache.layers[0].settings.max_cache_len
        self._seen: list[int] = []

    def capturable(self, device: torch.device) -> bool:
        return device.type == "cuda" and self.cache.layers[0].settings.backend != "torch"

    def prepare(self, steps: int, attention_mask, prompt: int) -> dict:
        for layer in self.cache.layers:
            layer.paged.reserve(steps)
        return {}  # no mask: each row's pages hold its real tokens only

    def before_step(self, cache_position: torch.Tensor) -> None:
        pass

    def before_capture(self) -> None:
        self._seen = [layer.seen for layer in self.cache.layers]

    def replayed(self, replays: int) -> None:
        for layer, seen in zip(self.cache.layers, self._seen, strict=True):
            layer.seen = seen + replays
            layer.paged.advance(replays)

    def check_errors(self) -> None:
        self.cache.check_errors()


class _StaticTarget:
    """What the loop needs of transformers' StaticCache: a boolean mask over its slots, which each
    step extends by its own slot (the cache counts its length on the device, so the replays need
    no correction)."""

    attention = STATIC_ATTENTION

    def __init__(self, cache: StaticCache):
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            raise ValueError("the StaticCache has sliding-window layers: generate_graphed serves full attention only")
        self.cache = cache
        self.capacity = cache.layers[0].max_cache_len
        self._mask: torch.Tensor | None = None

    def capturable(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def prepare(self, steps: int, attention_mask, prompt: int) -> dict:
        batch = self.cache.layers[0].keys.shape[0]
        device = self.cache.layers[0].keys.device
        self._mask = torch.zeros((batch, 1, 1, self.capacity), dtype=torch.bool, device=device)
        self._mask[:, 0, 0, :prompt] = True if attention_mask is None else attention_mask.bool()
        return {"attention_mask": self._mask}  # 4D: transformers passes it to SDPA as it is

    def before_step(self, cache_position: torch.Tensor) -> None:
        self._mask.index_fill_(-1, cache_position, True)  # the new token's slot (a device index: capturable)

    def before_capture(self) -> None:
        pass

    def replayed(self, replays: int) -> None:
        pass

    def check_errors(self) -> None:
        pass


def _target(model, cache) -> _KVBitsTarget | _StaticTarget:
    if isinstance(cache, KVBitsCache):
        target = _KVBitsTarget(cache)
    elif isinstance(cache, StaticCache):
        target = _StaticTarget(cache)
    else:
        raise TypeError(f"cache must be a KVBitsCache or a transformers StaticCache; got {type(cache).__name__}")
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation != target.attention:
        raise ValueError(f"model must be loaded with attn_implementation={target.attention!r} for a "
                         f"{type(cache).__name__}; it uses {implementation!r}")
    held = int(cache.get_seq_length())
    if held:
        raise ValueError(f"cache must be fresh (it holds {held} positions): reset() it or make another")
    return target


def _decode(model, target, tokens: list, kept: list | None, attention_mask, prompt: int, steps: int,
            logits: torch.Tensor, pick: TokenPicker, puts: _Puts, stop: EosStop | None) -> None:
    """Up to ``steps`` decode steps after the prompt's: the first eager (the warm-up), the rest
    replayed from one captured step where the target is capturable (eager otherwise), ``pick``
    choosing each token (a draw in a replay comes from the default generator as an eager one does); each step's
    token appended to ``tokens`` (and its logits to ``kept``) and put to ``puts``; no more once
    ``stop`` finds every row finished."""
    batch, device = tokens[0].shape[0], tokens[0].device
    inputs = target.prepare(steps, attention_mask, prompt)  # before the warm-up plans
    token = tokens[0].clone()  # the static buffers the step reads and advances
    position = (attention_mask.sum(-1, keepdim=True).long() if attention_mask is not None
                else torch.full((batch, 1), prompt, dtype=torch.long, device=device))
    cache_position = torch.full((1,), prompt, dtype=torch.long, device=device)
    last = torch.empty_like(logits)

    def step():
        target.before_step(cache_position)
        out = model(input_ids=token, position_ids=position, cache_position=cache_position,
                    past_key_values=target.cache, use_cache=True, logits_to_keep=1, **inputs)
        last.copy_(out.logits[:, -1])
        token.copy_(pick(last))
        if stop is not None:
            stop.pick(token)
        position.add_(1)
        cache_position.add_(1)

    def collect(replayed: bool) -> bool:
        """Keep the step's token; whether decoding goes on."""
        tokens.append(token.clone())
        if kept is not None:
            kept.append(last.clone())
        puts.put(tokens[-1][:, 0], replayed)
        return stop is None or not stop.all_finished()

    if not target.capturable(device):
        for _ in range(steps):
            step()
            if not collect(False):
                break
        return
    side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    if not collect(False) or steps == 1:
        return
    graph = torch.cuda.CUDAGraph()
    target.before_capture()
    replays = 0
    try:
        with torch.cuda.graph(graph):
            step()
        for _ in range(steps - 1):
            graph.replay()
            replays += 1
            if not collect(True):
                break
        puts.flush()
    finally:
        target.replayed(replays)  # also when a put or an interrupt stops the replays


class _Puts:
    """The streamer's side of the loop, as ``generate`` hands it tokens: CPU tensors, the prompt
    [B, S] then each new token [B]. A replayed token is copied to pinned host memory without
    waiting and put once the next replay is queued (one token behind), so that the device keeps
    a step queued while the host streams."""

    def __init__(self, streamer):
        self.streamer = streamer
        self.pending: deque = deque()

    def now(self, value: torch.Tensor) -> None:
        if self.streamer is not None:
            self.flush()
            self.streamer.put(value.cpu())

    def put(self, token: torch.Tensor, replayed: bool) -> None:
        if self.streamer is None:
            return
        if not replayed:
            self.now(token)
            return
        host = torch.empty(token.shape, dtype=token.dtype, pin_memory=True)
        host.copy_(token, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.pending.append((host, done))
        while len(self.pending) > 1:
            self._put_oldest()

    def flush(self) -> None:
        while self.pending:
            self._put_oldest()

    def end(self) -> None:
        if self.streamer is not None:
            self.flush()
            self.streamer.end()

    def _put_oldest(self) -> None:
        host, done = self.pending.popleft()
        done.synchronize()
        self.streamer.put(host)


def _prompt_positions(mask: torch.Tensor | None, batch: int, prompt: int, device) -> torch.Tensor:
    """Position ids of the prompt [B, S], as ``generate`` makes them: each row's real tokens
    counted from 0 (pads given 0)."""
    if mask is None:
        return torch.arange(prompt, device=device).expand(batch, prompt)
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 0)


def _check(target, input_ids, attention_mask, max_new_tokens) -> None:
    require_tensor("input_ids", input_ids)
    if input_ids.dim() != 2 or input_ids.dtype != torch.long or 0 in input_ids.shape:
        raise ValueError(f"input_ids must be int64 [B, S] with B, S >= 1; got {input_ids.dtype} "
                         f"{tuple(input_ids.shape)}")
    if attention_mask is not None:
        require_tensor("attention_mask", attention_mask)
        if attention_mask.shape != input_ids.shape or attention_mask.device != input_ids.device:
            raise ValueError(f"attention_mask must match input_ids ({tuple(input_ids.shape)}, {input_ids.device}); "
                             f"got {tuple(attention_mask.shape)} on {attention_mask.device}")
        right = (attention_mask[:, -1] == 0).nonzero().flatten().tolist()  # one read of the device, before the prompt
        if right:
            raise ValueError(f"attention_mask masks the last column of rows {right}: generate_graphed takes "
                             f"left-padded prompts (tokenizer padding_side='left'), each row's next token following "
                             f"its last column")
    if require_int("max_new_tokens", max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be at least 1; got {max_new_tokens}")
    need = input_ids.shape[1] + max_new_tokens - 1
    if need > target.capacity:
        raise ValueError(f"the prompt ({input_ids.shape[1]}) and max_new_tokens ({max_new_tokens}) need {need} "
                         f"positions; the cache holds max_cache_len={target.capacity}")
