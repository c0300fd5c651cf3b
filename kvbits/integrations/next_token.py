"""How a generation step turns its logits into the next token, as transformers' ``generate`` does,
in operations a CUDA graph can capture (none reads the device on the host): the greedy pick or one
draw after generate's warpers (:class:`TokenPicker`), and the rows finished by an end-of-sequence
id (:class:`EosStop`)."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .._checks import require_int


class TokenPicker:
    """The next token [B, 1] (int64) from a step's logits [B, V] (float32): their argmax, or with
    ``do_sample`` one draw from the softmax of the logits warped as ``generate`` warps them
    (temperature, then top-k, then top-p), from torch's default generator, as ``generate`` draws."""

    def __init__(self, do_sample: bool = False, temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None):
        if not isinstance(do_sample, bool):
            raise TypeError(f"do_sample must be a bool; got {type(do_sample).__name__}")
        given = [name for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p))
                 if value is not None]
        if given and not do_sample:
            raise ValueError(f"{', '.join(given)} shape sampling: pass do_sample=True (greedy decoding takes none)")
        self.do_sample = do_sample
        self.warpers = LogitsProcessorList()
        # generate's rule: a warper is applied only where it changes something
        if temperature is not None and _positive("temperature", temperature) != 1.0:
            self.warpers.append(TemperatureLogitsWarper(float(temperature)))
        if top_k is not None and require_int("top_k", top_k) != 0:
            if top_k < 0:
                raise ValueError(f"top_k must be non-negative (0: no top-k); got {top_k}")
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p is not None:
            if _positive("top_p", top_p) > 1.0:
                raise ValueError(f"top_p must be in (0, 1] (1: no top-p); got {top_p}")
            if top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(top_p=float(top_p)))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.do_sample:
            return logits.argmax(-1, keepdim=True)
        probs = self.warpers(None, logits).softmax(-1)  # the warpers read no input ids
        # torch.multinomial's own draw of one sample (the argmax of p / q, q ~ Exp(1), from the same
        # generator, so the same tokens for the same seed) without its validity checks, which read
        # the device and so cannot be captured
        return (probs / torch.empty_like(probs).exponential_(1)).argmax(-1, keepdim=True)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float; got {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{name} must be positive; got {value}")
    return float(value)


class EosStop:
    """Which rows have emitted an end-of-sequence id, on the device: :meth:`pick` (capturable) gives a
    finished row's next token ``pad`` and marks rows whose token is one of ``eos``."""

    def __init__(self, eos: torch.Tensor, pad: int, batch: int):
        self.eos, self.pad = eos, pad
        self.finished = torch.zeros((batch, 1), dtype=torch.bool, device=eos.device)

    @classmethod
    def make(cls, eos_token_id, pad_token_id, input_ids: torch.Tensor) -> EosStop | None:
        if eos_token_id is None:
            if pad_token_id is not None:
                raise ValueError("pad_token_id is given without eos_token_id: it only fills finished rows")
            return None
        ids = [eos_token_id] if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) else eos_token_id
        if not isinstance(ids, (list, tuple)) or not ids:
            raise TypeError(f"eos_token_id must be an int or a non-empty list of ints; got {eos_token_id!r}")
        for i in ids:
            if require_int("eos_token_id", i) < 0:
                raise ValueError(f"eos_token_id must be non-negative; got {i}")
        pad = ids[0] if pad_token_id is None else require_int("pad_token_id", pad_token_id)
        if pad < 0:
            raise ValueError(f"pad_token_id must be non-negative; got {pad}")
        return cls(torch.tensor(ids, dtype=torch.long, device=input_ids.device), pad, input_ids.shape[0])

    def pick(self, token: torch.Tensor) -> None:
        """token [B, 1], in place."""
        token.masked_fill_(self.finished, self.pad)
        self.finished.logical_or_(torch.isin(token, self.eos))

    def all_finished(self) -> bool:
        return bool(self.finished.all())  # a read of the device: the host decides whether to go on
