"""``python -m harness.gpu_verify [options] [pytest args]``: what ``nox -s gpu_verify --no-venv``
runs, for machines without nox (the installed torch/triton, no virtualenv). That documented
name is the module ``harness/gpu_verify.py``, which only calls :func:`main` here.

The suites over every visible GPU (one pytest-xdist worker per GPU, each pinned),
the benchmarks serially after them, the report always; exit code non-zero when
anything failed, 3 (and nothing run) without a CUDA device. Options as
``python -m harness.run.pipeline gpu_verify --help``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .pipeline import main as pipeline_main


def main(argv: Sequence[str] | None = None) -> int:
    return pipeline_main(["gpu_verify", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
