"""Compiling kernels for the runs (named ``compile``, not ``build``: ``.gitignore`` ignores
every ``build/`` directory).

- ``triton_cache``: a Triton cache manager that compiles each kernel specialization once per
  host (``TRITON_CACHE_MANAGER=harness.compile.triton_cache:CompileOnceCacheManager``).
- ``compile_cuda``: the nvcc compile check of every ``kvbits/cuda/*.cu``, with no GPU
  (``python -m harness.compile.compile_cuda``).
"""
