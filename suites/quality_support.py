"""What the quality suite and benchmark share: the model (loaded once per process), the device it
runs on, the recorded figures that gate quality (``reports/baselines/quality.json``) and how a
figure is recorded with its case."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch

from harness.quality.model import model_missing, text_missing

BASELINE = Path(__file__).resolve().parent.parent / "reports" / "baselines" / "quality.json"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def skip_without_model() -> None:
    """Skip the calling test where the model, its reader or the text is not here."""
    if reason := model_missing() or text_missing():
        pytest.skip(reason)


@functools.cache
def model_and_tokens():
    """(model fp32 on DEVICE, the text's token ids) once per process: fp32 so that the reference
    cache is the model's own precision, on CPU and GPU alike (TF32 stays off)."""
    import kvbits.integrations.transformers  # noqa: F401  (registers the "kvbits" attention)
    from harness.quality.model import load_model, text_tokens

    model, tokenizer = load_model(DEVICE, torch.float32)
    return model, text_tokens(tokenizer)


def baseline() -> dict:
    return json.loads(BASELINE.read_text())


def record_figures(record, name: str, figures, protocol) -> None:
    """The figures of one cache (or emulated scheme) as the case's metrics."""
    record.backend, record.device, record.variant = "transformers", DEVICE, name
    values = {k: v for k, v in dataclasses.asdict(figures).items() if v is not None}
    record.add(**values, protocol=protocol.describe())
