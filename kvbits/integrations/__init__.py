"""Bridges from other libraries to the kernels (optional dependencies, imported on demand).

- :mod:`.transformers`: a Hugging Face transformers ``Cache`` backed by
  :class:`~kvbits.decode.cache.PagedKVCache` and the ``"kvbits"`` attention that reads it.
"""
