"""Fixtures shared by every suite."""

from __future__ import annotations

import pytest
import torch

import kernels._runtime  # noqa: F401


@pytest.fixture
def rng() -> torch.Generator:
    """A generator seeded afresh for every test (inputs differ from run to run)."""
    gen = torch.Generator()
    gen.seed()
    return gen
