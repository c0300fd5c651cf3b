"""Teacher-forced decoding with the quantized cache read by every scored token, and the figures
it gives against the full-precision cache.

Per segment of the text (``prompt + steps + 1`` tokens): the cache is made, the prompt's
``prompt`` tokens go in as one step (prefill: attention over the prompt's own K/V, which the cache
stores), then each of the next ``steps`` tokens goes in alone, as a decode step does, and the
logits it yields are that step's prediction of the token after it. Every scored prediction
therefore comes from a step that read the whole stored past through the cache (for a quantized
cache: the quantized groups and its full-precision window); the prefill's own prediction is not
scored, since it read no stored token. A single forward over a whole sequence would score
predictions that never read the cache, and says nothing of it.

Figures per cache, over all scored tokens of all segments (:class:`Figures`):
perplexity (exp of the mean negative log-likelihood of the true next token); its change from the
reference cache's; the mean KL divergence KL(reference || cache) of each step's next-token
distribution; top-1 agreement (the cache's argmax equals the reference's); and the greedy tokens
a free-running greedy decode from each segment's prompt keeps equal to the reference's greedy
decode before the first difference (mean over segments; ``greedy`` tokens at most).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .caches import CacheSpec
from .emulate import Scheme, emulated_log_probs

REFERENCE = CacheSpec("full")


@dataclasses.dataclass(frozen=True)
class Protocol:
    """prompt: tokens prefilled per segment; steps: scored decode steps per segment; segments:
    how many; stride: tokens between segment starts (default prompt + steps + 1, no overlap);
    greedy: free-running greedy tokens compared per segment (0: none)."""

    prompt: int
    steps: int
    segments: int
    stride: int | None = None
    greedy: int = 0

    def __post_init__(self):
        for name in ("prompt", "steps", "segments"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if self.stride is not None and (isinstance(self.stride, bool) or not isinstance(self.stride, int)
                                        or self.stride <= 0):
            raise ValueError(f"stride must be None or a positive int; got {self.stride!r}")
        if isinstance(self.greedy, bool) or not isinstance(self.greedy, int) or self.greedy < 0:
            raise ValueError(f"greedy must be an int >= 0; got {self.greedy!r}")

    @property
    def span(self) -> int:
        """Tokens one segment reads: the prompt, the scored steps and the last step's target."""
        return self.prompt + self.steps + 1

    def segments_of(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """The segments of ``tokens`` int64 [N]; ValueError when the text is too short."""
        stride = self.stride or self.span
        need = (self.segments - 1) * stride + self.span
        if tokens.numel() < need:
            raise ValueError(f"{self.segments} segments of {self.span} tokens {stride} apart need {need} tokens; the "
                             f"text has {tokens.numel()}")
        return [tokens[i * stride: i * stride + self.span] for i in range(self.segments)]

    def describe(self) -> str:
        return (f"{self.segments} segments x ({self.prompt}-token prompt prefilled, then {self.steps} teacher-forced "
                f"decode steps, each reading the stored cache) = {self.segments * self.steps} scored tokens")


@dataclasses.dataclass(frozen=True)
class Figures:
    perplexity: float
    perplexity_change: float  # relative to the reference's: 0.021 is +2.1%
    kl: float  # mean KL(reference || cache) per scored token, nats
    top1: float  # fraction of scored tokens whose argmax equals the reference's
    greedy_matched: float | None  # mean greedy tokens before the first difference, None when not run
    bytes_per_token: float | None  # None for an emulated scheme
    scored: int


def teacher_forced(model, segment: torch.Tensor, spec: CacheSpec, prompt: int) -> tuple[torch.Tensor, object]:
    """Log-probabilities fp32 [steps, vocab] of each decode step's next token over ``segment``
    (on the model's device), and the cache after the last step."""
    device = next(model.parameters()).device
    ids = segment.to(device)[None]
    steps = segment.numel() - 1 - prompt
    model.set_attn_implementation(spec.attention)
    cache = spec.make(model.config, prompt + steps)
    out = torch.empty(steps, model.config.vocab_size, dtype=torch.float32, device=device)
    with torch.inference_mode():
        model(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True)
        for i in range(steps):
            t = prompt + i
            logits = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
            out[i] = logits[0, -1].float().log_softmax(-1)
    return out, cache


def greedy(model, prompt_ids: torch.Tensor, spec: CacheSpec, tokens: int) -> torch.Tensor:
    """The ``tokens`` greedy tokens int64 [tokens] after ``prompt_ids`` [P] with the cache ``spec``
    (every token generated, no stop at eos)."""
    device = next(model.parameters()).device
    model.set_attn_implementation(spec.attention)
    cache = spec.make(model.config, prompt_ids.numel() + tokens)
    ids = prompt_ids.to(device)[None]
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, pad_token_id=model.config.eos_token_id)
    return out[0, ids.shape[1]:].cpu()


def matched_before_divergence(a: torch.Tensor, b: torch.Tensor) -> int:
    """Leading tokens equal in a and b."""
    differ = (a != b).nonzero()
    return int(differ[0, 0]) if differ.numel() else int(min(a.numel(), b.numel()))


def measure(model, tokens: torch.Tensor, protocol: Protocol, specs: list[CacheSpec | Scheme],
            reference: CacheSpec = REFERENCE) -> dict[str, Figures]:
    """:class:`Figures` per cache (by :attr:`CacheSpec.name`, the reference's included) or emulated
    scheme (by :meth:`Scheme.label`: no greedy decode, which needs a real cache, and no bytes)
    over the protocol's segments of ``tokens``. Runs one segment at a time, keeping only the
    reference's log-probabilities of it."""
    runs = [reference, *specs]
    names = [run.name if isinstance(run, CacheSpec) else run.label() for run in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"specs must differ from each other and from the reference; got {names}")
    sums = {name: {"nll": 0.0, "kl": 0.0, "top1": 0, "greedy": 0, "bytes": None} for name in names}
    segments = protocol.segments_of(tokens)
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    for segment in segments:
        targets = segment[protocol.prompt + 1:].to(device)
        ref_lp, ref_cache = teacher_forced(model, segment, reference, protocol.prompt)
        ref_top = ref_lp.argmax(-1)
        ref_greedy = greedy(model, segment[:protocol.prompt], reference, protocol.greedy) if protocol.greedy else None
        for run, name in zip(runs, names, strict=True):
            acc = sums[name]
            if run is reference:
                lp, cache = ref_lp, ref_cache
            elif isinstance(run, Scheme):
                lp, cache = emulated_log_probs(model, segment, run, protocol.prompt), None
            else:
                lp, cache = teacher_forced(model, segment, run, protocol.prompt)
            acc["nll"] -= lp.gather(1, targets[:, None]).sum().item()
            acc["kl"] += (ref_lp.exp() * (ref_lp - lp)).sum().item()
            acc["top1"] += int((lp.argmax(-1) == ref_top).sum())
            if cache is not None:
                acc["bytes"] = run.bytes_per_token(cache, model.config, protocol.prompt + protocol.steps, dtype)
            if ref_greedy is not None and isinstance(run, CacheSpec):
                mine = ref_greedy if run is reference else greedy(model, segment[:protocol.prompt], run,
                                                                  protocol.greedy)
                acc["greedy"] += matched_before_divergence(mine, ref_greedy)
            del cache
    scored = protocol.steps * len(segments)
    base = math.exp(sums[names[0]]["nll"] / scored)
    figures = {}
    for run, name in zip(runs, names, strict=True):
        acc = sums[name]
        ppl = math.exp(acc["nll"] / scored)
        figures[name] = Figures(
            perplexity=ppl, perplexity_change=ppl / base - 1.0, kl=acc["kl"] / scored, top1=acc["top1"] / scored,
            greedy_matched=acc["greedy"] / len(segments) if protocol.greedy and isinstance(run, CacheSpec) else None,
            bytes_per_token=acc["bytes"], scored=scored)
    return figures
