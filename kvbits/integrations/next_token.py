"""How a generation step turns its logits into the next token, as transformers' ``generate`` does,
in operations a CUDA graph can capture (none reads the device on the host): the settings
``generate`` would use (:func:`generation_settings`), the greedy pick or one draw after
generate's warpers (:class:`TokenPicker`), and the rows finished by an end-of-sequence id
(:class:`EosStop`)."""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .._checks import require_int

SAMPLING_ARGUMENTS = ("temperature", "top_k", "top_p")
# What else in a generation config changes generate's next token in greedy or sampled decoding,
# each with the value that changes nothing (None changes nothing for any): none of it is applied
# here, so a config that sets one is refused rather than decoded otherwise than generate decodes it.
UNAPPLIED = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
             "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "sequence_bias": None,
             "guidance_scale": 1.0, "forced_bos_token_id": None, "forced_eos_token_id": None,
             "suppress_tokens": None, "begin_suppress_tokens": None, "exponential_decay_length_penalty": None,
             "remove_invalid_values": False, "watermarking_config": None, "num_return_sequences": 1}
UNAPPLIED_SAMPLING = {"min_p": None, "top_h": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
UNAPPLIED_WITH_EOS = {"min_length": 0, "min_new_tokens": 0}  # generate applies these only with an eos id
MODES = ("greedy_search", "sample")  # the generation modes served (GenerationMode's values)


def generation_settings(model, **given) -> dict:
    """``given`` (do_sample, temperature, ...) with each None replaced as ``generate`` replaces it:
    by the model's ``generation_config`` value, else transformers' default. Raises ValueError where
    the resolved config asks for another generation mode (beams, contrastive search, assisted or
    constrained decoding, several sequences per prompt) or sets a logits processor that
    generate_graphed does not apply."""
    config = copy.deepcopy(getattr(model, "generation_config", None) or GenerationConfig())
    config.update(**{name: value for name, value in given.items() if value is not None})
    for name, default in GenerationConfig._get_default_generation_params().items():
        if getattr(config, name, None) is None:
            setattr(config, name, default)
    mode = config.get_generation_mode().value
    if mode not in MODES:
        raise ValueError(f"the generation settings ask for {mode} (model.generation_config with the arguments given): "
                         f"generate_graphed decodes greedily or samples one sequence per prompt")
    settings = {name: getattr(config, name, None) for name in given}
    unapplied = {**UNAPPLIED, **(UNAPPLIED_SAMPLING if settings.get("do_sample") else {}),
                 **(UNAPPLIED_WITH_EOS if settings.get("eos_token_id") is not None else {})}
    set_ = [f"{name}={getattr(config, name)!r}" for name, inert in unapplied.items()
            if getattr(config, name, None) not in (None, inert, [], ())]
    if set_:
        raise ValueError(f"model.generation_config sets {', '.join(set_)}, which generate_graphed does not apply "
                         f"(it applies do_sample, temperature, top_k, top_p and eos_token_id): unset it there")
    return settings


class TokenPicker:
    """The next token [B, 1] (int64) from a step's logits [B, V] (float32) on ``device``: their
    argmax, or with ``do_sample`` one draw from the softmax of the logits warped as ``generate``
    warps them (temperature, then top-k, then top-p, each only where it changes something), from
    torch's default generator, as ``generate`` draws. Arguments are generate's, already resolved
    (:func:`generation_settings`, where transformers warns of sampling arguments given to greedy
    decoding, as in generate); greedy decoding reads none of them. A draw from a distribution
    holding NaN (logits with NaN or +inf) is flagged on the device and raised by :meth:`check_errors`."""

    def __init__(self, device: torch.device, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0):
        if not isinstance(do_sample, bool):
            raise TypeError(f"do_sample must be a bool; got {type(do_sample).__name__}")
        self.do_sample = do_sample
        # allocated here, not in a step: a tensor made inside a capture would be made anew each replay
        self.invalid = torch.zeros((), dtype=torch.bool, device=device)
        self.warpers = LogitsProcessorList()
        if not do_sample:
            return
        if _positive("temperature", temperature) != 1.0:
            self.warpers.append(TemperatureLogitsWarper(float(temperature)))
        if require_int("top_k", top_k) < 0:
            raise ValueError(f"top_k must be non-negative (0: no top-k); got {top_k}")
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if not 0.0 <= _number("top_p", top_p) <= 1.0:
            raise ValueError(f"top_p must be in [0, 1] (1: no top-p); got {top_p}")
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=float(top_p)))

    @classmethod
    def resolved(cls, settings: dict, device: torch.device) -> TokenPicker:
        """The picker for :func:`generation_settings`' result."""
        return cls(device, settings["do_sample"], *(settings[name] for name in SAMPLING_ARGUMENTS))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.do_sample:
            return logits.argmax(-1, keepdim=True)
        probs = self.warpers(None, logits).softmax(-1)  # the warpers read no input ids
        self.invalid.logical_or_(probs.isnan().any())  # softmax gives NaN, never inf or < 0: multinomial's check
        # torch.multinomial's own draw of one sample (the argmax of p / q, q ~ Exp(1), from the same
        # generator, so the same tokens for the same seed) without its validity checks, which read
        # the device and so cannot be captured
        return (probs / torch.empty_like(probs).exponential_(1)).argmax(-1, keepdim=True)

    def check_errors(self) -> None:
        """Raise RuntimeError where a draw's distribution held NaN (one read of the device)."""
        if self.do_sample and bool(self.invalid):
            raise RuntimeError("a sampled step's probabilities held NaN (its logits held NaN or +inf), as "
                               "torch.multinomial refuses: the drawn tokens are not a sample")


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float; got {type(value).__name__}")
    return float(value)


def _positive(name: str, value) -> float:
    if not _number(name, value) > 0:
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
            return None  # a pad id alone fills nothing, as in generate
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
