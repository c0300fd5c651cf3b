"""Checking the checks and the kernels beyond the suites.

- ``mutant_catalogue``: every planted bug, as data (file, text replaced, replacement, what must
  catch it); ``mutants``: the runner that plants each one in a copy of the project and runs the
  tests that must catch it (``python -m harness.checks.mutants``).
- ``sanitize``: compute-sanitizer memcheck, racecheck and initcheck over every GPU kernel
  (``python -m harness.checks.sanitize``).
"""
