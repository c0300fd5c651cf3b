"""``python -m harness report RESULTS... [-o reports/report.html] [--baseline PATH] [--junit PATH]
[--summary-md PATH] [--write-baseline PATH]``, ``python -m harness summarize RESULTS...``,
``python -m harness suspects RESULTS... --baseline PATH`` (the kernel cases slower than the baseline
beyond threshold and noise and the cases whose error grew past its factor, which the pipeline
runs once more) and
``python -m harness ab [BASE] [options] [pytest args]`` (a same-job A/B, harness/run/ab.py)."""

import sys

if __name__ == "__main__":
    from .report.cli import main

    sys.exit(main())
