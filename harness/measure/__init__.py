"""Measuring: figures a run records about speed and cost. Imports nothing else of the harness.

- ``noise``: the repeats' spread of a timing (``Timing``) and the noise of its median from it
  (standard library only).
- ``timing``: kernel timings with their repeats' spread (``do_bench``, CUDA-graph replay), whether
  a call is bound by the host or the device, the copy and write bandwidth ceilings,
  ``bandwidth_metrics``.
- ``read_floor``: the time one kernel takes to only read a given number of bytes.
- ``sass``: the static instruction budget of compiled Triton kernels, with no GPU
  (``python -m harness.measure.sass``).
- ``timeline``: where a pytest run's wall time goes outside its tests.
- ``progress``: one line per benchmark measurement as it lands.
"""

# The harness's own Triton kernels (modules listing AOT_SPECS): compiled ahead of time beside
# kvbits.aot's KERNEL_MODULES, which name kvbits' kernels only (python -m kvbits.aot --also ...).
HARNESS_KERNEL_MODULES = ("harness.measure.read_floor",)
