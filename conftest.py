"""Root conftest: registers the harness's recording plugin for every test run.

It decides the Triton interpreter mode (kvbits._runtime) before any test module defines a
kernel, except in the controller of a run spread over GPUs, which runs no test and leaves
torch to its workers."""

import os

from harness.run.commands import spread_controller

if not spread_controller(os.environ):
    import kvbits._runtime  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

pytest_plugins = ["harness.plugin", "pytester"]
