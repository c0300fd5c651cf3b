"""Quality benchmark on a real decoder (records figures, asserts nothing about them; the gate is
``test_quality.py``): SmolLM2-135M-Instruct in fp32 reading the GNU GPL, GFDL and Apache licence
texts, teacher-forced decode with every scored token reading the stored cache
(:mod:`harness.quality.protocol`).

- ``standard``: 2 segments, each a 256-token prompt and 512 scored decode steps (1,024 scored
  tokens), plus a 32-token greedy decode per segment against the fp32 cache's;
- ``long``: one segment at the model's trained context (read from the GGUF's metadata): the
  prompt fills it but for 512 scored steps, since quantization error grows with the context.

Caches: fp32 (the reference), fp16, kvbits at 2, 3 and 4 bits, transformers' QuantizedCache with
quanto (int4, int2) and HQQ (4, 3, 2 bits) where installed; and, emulated in one pass
(:mod:`harness.quality.emulate`), the scheme options the kernels do not hold yet, each alone and
combined. On CPU (the torch path; minutes per cache at full size) a 32-token prompt and 16 steps
show that it runs.
"""

from __future__ import annotations

import pytest
import torch
from quality_support import DEVICE, model_and_tokens, record_figures, skip_without_model

from harness.quality.caches import CacheSpec
from harness.quality.emulate import Scheme
from harness.quality.model import trained_context
from harness.quality.protocol import Protocol, measure

pytestmark = [pytest.mark.bench, pytest.mark.sweep]  # minutes on a GPU: the bench session runs it, gpu_verify does not

GPU = torch.cuda.is_available()
STEPS = 512 if GPU else 16
CACHES = [CacheSpec("fp16"), *(CacheSpec("kvbits", b) for b in (4, 3, 2)),
          *(CacheSpec("kvbits", b, sinks=0, window=0) for b in (4, 3, 2)), CacheSpec("quanto", 4),
          CacheSpec("quanto", 2), *(CacheSpec("hqq", b) for b in (4, 3, 2))]
# the scheme options, each alone and combined, at each width (kvbits' own scheme first; "holds-zero"
# is its range before it became the group's own)
SCHEMES = [Scheme(b, **options) for b in (4, 3, 2) for options in (
    {}, {"zero": "holds-zero"}, {"zero": "float"}, {"window": 64}, {"sinks": 64}, {"window": 64, "sinks": 64},
    {"window": 128, "sinks": 64}, {"window": 128, "sinks": 64, "k_group_size": 32}, {"k_group_size": 32},
    {"rotate": "kv"}, {"pre_rope": True})]


def _protocol(case: str) -> Protocol:
    if case == "standard":
        return Protocol(prompt=256 if GPU else 32, steps=STEPS, segments=2 if GPU else 1, greedy=32 if GPU else 4)
    return Protocol(prompt=trained_context() - STEPS - 1 if GPU else 96, steps=STEPS, segments=1)


@pytest.mark.parametrize("case", ["standard", "long"])
def test_bench_quality(record, case):
    skip_without_model()
    model, tokens = model_and_tokens()
    protocol = _protocol(case)
    runs = [s for s in CACHES if not s.missing()] + (SCHEMES if GPU or case == "standard" else SCHEMES[:1])
    figures = measure(model, tokens, protocol, runs)
    record_figures(record, case, figures["full"], protocol)
    record.add(caches={name: {k: v for k, v in vars(f).items() if v is not None} for name, f in figures.items()},
               skipped={s.name: s.missing() for s in CACHES if s.missing()}, device_kind=DEVICE)
