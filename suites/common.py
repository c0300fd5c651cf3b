"""Helpers every suite shares."""

from __future__ import annotations

import torch


def available_devices() -> list[str]:
    """Devices the suites run on: the CPU always, the GPU when there is one."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
