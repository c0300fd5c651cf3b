"""The validation harness: it runs the suites, records every case, measures, plants bugs and
renders the report. It runs from a checkout (``python -m harness ...`` in the repository root) and
is not in the wheel, which holds ``kvbits`` alone; kvbits imports nothing of it. Its parts, each
importing only parts listed before it (tests/test_harness_layout.py checks that no import cycle
forms):

- ``records`` (module): the result record, its JSON Lines writer and reader, the run manifest;
  every other part reads it. ``history`` (module): every GPU run's records in one database,
  a SQLite file or a PostgreSQL server a fleet shares (``python -m harness.history``; reached
  through ``history_db``).
- ``measure/``: timing and bandwidth, the read floor, the static SASS budget, where a run's wall
  time goes, benchmark progress lines. Imports nothing else of the harness.
- ``run/``: the version legs, every command line, the pipeline (``python -m
  harness.run.pipeline``), child processes, the environment a run records, run directories
  written as results arrive, the GPU-worker pinning plugin.
- ``plugin`` (module): the pytest plugin that records every suite case (``-p harness.plugin``;
  the root ``conftest.py`` loads it).
- ``checks/``: planted bugs (the mutant catalogue, as data, and its runner) and
  compute-sanitizer runs.
- ``compile/``: the compile-once Triton cache manager and the nvcc compile check.
- ``report/``: the HTML report, JUnit XML and summaries (``python -m harness report``).
- ``peers/``: the decode attention users would pick instead of kvbits (torch SDPA, FlexAttention,
  FlashInfer, flash-attn, transformers' quantized cache), each behind one interface for the
  decode benchmarks. Imports none of the above.

``python -m harness.gpu_verify`` keeps its documented name: ``gpu_verify`` (module) only calls
``harness.run.gpu_verify``.
"""
