"""Greedy generation on a :class:`~kernels.integrations.transformers.KVBitsCache` whose decode
steps replay one captured CUDA graph: the model's whole forward (every layer's append and fused
decode with it), the greedy pick and the move to the next position, with no host work per token
but the replay::

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvbits")
    cache = KVBitsCache(model.config, max_cache_len=prompt_len + 64)
    sequences = generate_graphed(model, input_ids, attention_mask, cache=cache, max_new_tokens=64)

The prompt's step runs eagerly (exact attention; the prompt quantized into the cache). Every
layer's pool then reserves the pages and the decode plan for the tokens to come, one decode step
runs eagerly on static buffers (the token, its positions) as the warm-up, the same step is
captured, and the graph is replayed for each further token. transformers' ``generate`` is not
used: its per-step host work (masks, positions, stopping criteria, logits processors) is what the
graph leaves out; the decode steps pass no attention mask (each row's cache holds its real tokens
only, so the fused decode needs none) and each row's position ids (its real tokens so far, as
``generate`` counts them with left padding).

Greedy only, exactly ``max_new_tokens`` tokens (no stop at an end-of-sequence token: cut the
sequences after it), the models :class:`KVBitsCache` serves. On a device without CUDA graphs
(CPU) the same steps run eagerly, one forward each.
"""

from __future__ import annotations

import torch

from .._checks import require_int, require_tensor
from .transformers import ATTENTION_NAME, KVBitsCache


def generate_graphed(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cache: KVBitsCache, max_new_tokens: int, return_logits: bool = False, streamer=None):
    """Greedy decoding of ``max_new_tokens`` tokens after ``input_ids`` [B, S] (int64; left-padded
    rows with ``attention_mask`` [B, S], 1 for a real token) with ``model`` (loaded with
    ``attn_implementation="kvbits"``) on ``cache`` (a fresh KVBitsCache for S + max_new_tokens
    positions). Returns the sequences [B, S + max_new_tokens], and with ``return_logits`` also
    each new token's logits [B, max_new_tokens, V] (float32). The cache holds S +
    max_new_tokens - 1 positions afterwards, as after ``generate``. ``streamer``: as
    ``generate``'s, ``put`` with the prompt, then with each new token [B, 1] (on the device, as
    soon as it is issued), then ``end``."""
    _check(model, input_ids, attention_mask, cache, max_new_tokens)
    if streamer is not None:
        streamer.put(input_ids)
    batch, prompt = input_ids.shape
    device = input_ids.device
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=_prompt_positions(attention_mask, batch, prompt, device),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].float()
        tokens, kept = [logits.argmax(-1, keepdim=True)], [logits.clone()] if return_logits else None
        if streamer is not None:
            streamer.put(tokens[0])
        steps = max_new_tokens - 1
        if steps:
            _decode(model, cache, tokens, kept, attention_mask, batch, prompt, steps, logits, streamer)
    if streamer is not None:
        streamer.end()
    sequences = torch.cat([input_ids, *tokens], dim=1)
    return (sequences, torch.stack(kept, dim=1)) if return_logits else sequences


def _decode(model, cache: KVBitsCache, tokens: list, kept: list | None, attention_mask, batch: int, prompt: int,
            steps: int, logits: torch.Tensor, streamer) -> None:
    """``steps`` decode steps after the prompt's: the first eager (the warm-up), the rest replayed
    from one captured step on a GPU (eager on CPU); each step's token appended to ``tokens`` (and its
    logits to ``kept``) and put to ``streamer``."""
    device = tokens[0].device
    for layer in cache.layers:  # pages and the decode plan for every step, before the warm-up plans
        layer.paged.reserve(steps)
    token = tokens[0].clone()  # the static buffers the step reads and advances
    position = (attention_mask.sum(-1, keepdim=True).long() if attention_mask is not None
                else torch.full((batch, 1), prompt, dtype=torch.long, device=device))
    cache_position = torch.full((1,), prompt, dtype=torch.long, device=device)
    last = torch.empty_like(logits)

    def step():
        out = model(input_ids=token, position_ids=position, cache_position=cache_position, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        last.copy_(out.logits[:, -1])
        token.copy_(last.argmax(-1, keepdim=True))
        position.add_(1)
        cache_position.add_(1)

    def collect():
        tokens.append(token.clone())
        if kept is not None:
            kept.append(last.clone())
        if streamer is not None:
            streamer.put(tokens[-1])

    graphs = device.type == "cuda"
    if graphs:
        side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
    else:
        step()
    collect()
    if steps == 1:
        return
    if not graphs:
        for _ in range(steps - 1):
            step()
            collect()
        return
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(steps - 1):
        graph.replay()
        collect()
    for layer in cache.layers:  # the host saw the capture (counted, nothing ran), not the replays
        layer.seen += steps - 2
        layer.paged.advance(steps - 1)
    cache.check_errors()


def _prompt_positions(mask: torch.Tensor | None, batch: int, prompt: int, device) -> torch.Tensor:
    """Position ids of the prompt [B, S], as ``generate`` makes them: each row's real tokens
    counted from 0 (pads given 1)."""
    if mask is None:
        return torch.arange(prompt, device=device).expand(batch, prompt)
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 1)


def _check(model, input_ids, attention_mask, cache, max_new_tokens) -> None:
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation != ATTENTION_NAME:
        raise ValueError(f"model must be loaded with attn_implementation={ATTENTION_NAME!r}; it uses "
                         f"{implementation!r}")
    if not isinstance(cache, KVBitsCache):
        raise TypeError(f"cache must be a KVBitsCache; got {type(cache).__name__}")
    if cache.get_seq_length():
        raise ValueError(f"cache must be fresh (it holds {cache.get_seq_length()} positions): reset() it or make "
                         f"another")
    require_tensor("input_ids", input_ids)
    if input_ids.dim() != 2 or input_ids.dtype != torch.long or 0 in input_ids.shape:
        raise ValueError(f"input_ids must be int64 [B, S] with B, S >= 1; got {input_ids.dtype} "
                         f"{tuple(input_ids.shape)}")
    if attention_mask is not None:
        require_tensor("attention_mask", attention_mask)
        if attention_mask.shape != input_ids.shape or attention_mask.device != input_ids.device:
            raise ValueError(f"attention_mask must match input_ids ({tuple(input_ids.shape)}, {input_ids.device}); "
                             f"got {tuple(attention_mask.shape)} on {attention_mask.device}")
    if require_int("max_new_tokens", max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be at least 1; got {max_new_tokens}")
    need = input_ids.shape[1] + max_new_tokens - 1
    limit = cache.layers[0].settings.max_cache_len
    if need > limit:
        raise ValueError(f"the prompt ({input_ids.shape[1]}) and max_new_tokens ({max_new_tokens}) need {need} "
                         f"positions; the cache holds max_cache_len={limit}")
