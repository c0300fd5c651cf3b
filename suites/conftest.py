"""Fixtures shared by every suite. No torch import at module level: the controller of a run
spread over GPUs loads this file but runs no test (see the root conftest)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch


@pytest.fixture
def rng(record) -> torch.Generator:
    """A generator seeded afresh for every test (inputs differ from run to run); the seed is
    recorded with the case so that a failure can be replayed with ``torch.Generator().manual_seed``."""
    import torch

    gen = torch.Generator()
    record.add(seed=gen.seed())
    return gen
