"""Bridges from other libraries to the kernels (optional dependencies, imported on demand).

- :mod:`.transformers`: a Hugging Face transformers ``Cache`` backed by
  :class:`~kernels.decode.cache.PagedKVCache` and the ``"kvbits"`` attention that reads it.
"""
