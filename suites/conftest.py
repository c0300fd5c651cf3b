"""Fixtures shared by every suite."""

from __future__ import annotations

import pytest
import torch

import kernels._runtime  # noqa: F401


@pytest.fixture
def rng(record) -> torch.Generator:
    """A generator seeded afresh for every test (inputs differ from run to run); the seed is
    recorded with the case so that a failure can be replayed with ``torch.Generator().manual_seed``."""
    gen = torch.Generator()
    record.add(seed=gen.seed())
    return gen
