"""pytest plugin: one pytest-xdist worker per GPU, pinned before CUDA starts.

Load it first: ``python -m pytest -p harness.run.gpu_workers -n 2 ...`` with ``KVH_GPUS``
listing the devices to spread over (entries of ``CUDA_VISIBLE_DEVICES``: indices or
UUIDs, comma-separated). Worker ``gwN`` takes entry ``N mod len(KVH_GPUS)``:

- ``CUDA_VISIBLE_DEVICES`` becomes that one entry, so the worker sees its GPU as
  ``cuda:0`` and nothing else;
- ``KVH_EXT_DIR`` (the CUDA extension build root of ``kvbits/cuda/loader.py``)
  becomes a directory of that GPU's own; the workers of one GPU take turns there
  under the loader's file lock (one builds, the others load);
- every record the worker writes carries ``metrics["gpu"]``, the entry it ran on.

CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it initializes, and the root
``conftest.py`` imports torch and asks for devices. So the pinning happens when
this module is imported: pytest imports ``-p`` plugins before setuptools plugins
and before any ``conftest.py``, and pytest-xdist sets ``PYTEST_XDIST_WORKER``
before that. In the controller process (no ``PYTEST_XDIST_WORKER``), or without
``KVH_GPUS``, nothing changes.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping, Sequence

import pytest

from ..records import PROPERTY
from .commands import GPUS_VAR, pinned_env

PINNED_VAR = "KVH_WORKER_GPU"
_WORKER_ID = re.compile(r"^gw(\d+)$")


def parse_devices(value: str | None) -> list[str]:
    """``"0, 2,GPU-ab"`` -> ``["0", "2", "GPU-ab"]``; empty or unset -> ``[]``."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def device_for_worker(worker_id: str, devices: Sequence[str]) -> str:
    """The device of xdist worker ``gwN``: entry ``N mod len(devices)``."""
    match = _WORKER_ID.match(worker_id)
    if not match:
        raise ValueError(f"worker_id must look like 'gw<N>', got {worker_id!r}")
    if not devices:
        raise ValueError("devices must name at least one GPU")
    return devices[int(match.group(1)) % len(devices)]


def pin(environ: MutableMapping[str, str]) -> str | None:
    """Pin this process (an xdist worker) to its GPU by editing ``environ``.

    Returns the device entry, or None when this is not a worker or no GPUs are listed.
    Calling it again in the same process changes nothing.
    """
    if environ.get(PINNED_VAR):
        return environ[PINNED_VAR]
    worker = environ.get("PYTEST_XDIST_WORKER")
    devices = parse_devices(environ.get(GPUS_VAR))
    if not worker or not devices:
        return None
    device = device_for_worker(worker, devices)
    environ.update(pinned_env(device, environ))
    environ[PINNED_VAR] = device
    return device


DEVICE = pin(os.environ)


def _tag(item, device: str) -> None:
    """Add ``gpu`` to the case's record payload (creating one when the test has no ``record``)."""
    for name, payload in item.user_properties:
        if name == PROPERTY:
            payload["metrics"].setdefault("gpu", device)
            return
    item.user_properties.append(
        (PROPERTY, {"backend": None, "variant": None, "device": None, "metrics": {"gpu": device}})
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if DEVICE is not None and call.when == "setup":
        _tag(item, DEVICE)
    yield


def pytest_report_header(config) -> str | None:
    devices = parse_devices(os.environ.get(GPUS_VAR))
    if devices and not hasattr(config, "workerinput"):
        return f"gpu workers: spread over {GPUS_VAR}={','.join(devices)}, one GPU per worker"
    return None
