"""Running the suites: what to run, on which stacks, and how.

- ``legs``: the version legs (``INTERPRETER_LEGS``, ``GPU_LEGS``) every session and workflow runs on.
- ``commands``: every command line, built by pure functions (pip, pytest, the pipeline's steps,
  the report, nvcc and ahead-of-time compiles, docker, the GitHub matrices, CPU affinity and GPU
  pinning); ``python -m harness.run.commands matrix gpu|interpreter``.
- ``pipeline``: one validation pipeline, suites then benchmarks then the report
  (``python -m harness.run.pipeline KIND``); ``gpu_verify``: its GPU entry, run as
  ``python -m harness.gpu_verify``.
- ``gpu_workers``: the pytest plugin that pins each pytest-xdist worker to one GPU
  (``-p harness.run.gpu_workers``).
- ``env``: the machine and software stack a run records in its manifest.
- ``streamed_run``: a run directory written as results arrive, for runners outside pytest.
- ``subproc``: child processes with a deadline, killed with their whole process group.
"""
