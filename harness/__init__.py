"""The validation harness: environment capture, result records, timing, the pytest
plugin that records every suite case, and the report renderer."""

__all__ = ["records", "env", "timing"]
