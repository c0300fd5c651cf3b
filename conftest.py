"""Root conftest: registers the harness's recording plugin for every test run."""

import kernels._runtime  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

pytest_plugins = ["harness.plugin", "pytester"]
