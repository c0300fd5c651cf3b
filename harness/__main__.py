"""``python -m harness report RESULTS... [-o reports/report.html] [--baseline PATH] [--junit PATH]
[--summary-md PATH] [--write-baseline PATH]`` and ``python -m harness summarize RESULTS...``."""

import sys

from .report.cli import main

if __name__ == "__main__":
    sys.exit(main())
