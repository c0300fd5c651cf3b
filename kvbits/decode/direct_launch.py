"""Kernel launches with fixed arguments, through the compiled kernel's own launcher.

A decode step launches the same kernels with the same arguments but a few (q, k, v, the output)
every time. Triton's JIT launch specializes every argument on each call (tens of microseconds
of host time for 45 arguments); :class:`Launch` does that once: after the first call through the
JIT function has compiled the kernel, it calls the compiled kernel's launch function
(``CompiledKernel.run``, as ``CompiledKernel[grid]`` does, without its per-call lookups of the
device and launch metadata) with the arguments in parameter order (a tuple argument as a tuple,
as the launcher takes it), as long as the per-call arguments specialize as they did then (the key
the caller passes). With Triton's launch hooks
set (a profiler) it goes through ``CompiledKernel[grid]``, so that they see every launch. Where a
Triton release's launcher takes its arguments otherwise (a TypeError), it goes back to the JIT
launch for good.
"""

from __future__ import annotations

import torch

from .._runtime import triton_interpreted


class Launch:
    """One kernel launch whose arguments are fixed but for the first few, given per call with a
    key of how the compiler specializes them (pointer alignment, strides). ``fixed``: the
    arguments after those, in parameter order (a tuple) or by parameter name (a dict)."""

    def __init__(self, kernel, grid, fixed: tuple | dict, options: dict):
        # named fixed arguments travel with the constexprs, which the launch also passes by name
        self.fixed, self.options = ((), {**fixed, **options}) if isinstance(fixed, dict) else (fixed, options)
        self.kernel, self.grid = kernel, grid
        self._runner = None  # (key, a function launching the compiled kernel on the per-call arguments)
        self._direct = not triton_interpreted()  # False once a release's launcher turned the call down

    def __call__(self, key: tuple, *given) -> None:
        runner = self._runner
        if runner is not None and runner[0] == key:
            try:
                runner[1](given)
                return
            except TypeError:  # this release's launcher takes its arguments otherwise
                self._runner, self._direct = None, False
        compiled = self.kernel[self.grid](*given, *self.fixed, **self.options)
        if self._direct and (runner is None or runner[0] != key):
            found = _compiled_runner(self.kernel, compiled, self.grid, len(given), self.fixed, self.options)
            self._runner = None if found is None else (key, found)
            self._direct = found is not None


def _address(arg):
    """A tensor argument as its device address (an int the launcher takes as it is), a tuple
    argument with its tensors so; others as given."""
    if isinstance(arg, tuple):
        return tuple(map(_address, arg))
    return arg.data_ptr() if isinstance(arg, torch.Tensor) else arg


def specialization(t: torch.Tensor) -> tuple:
    """What a launch specializes a tensor argument on (its pointer's 16-byte alignment) and its
    strides, which the launches pass beside it."""
    return t.data_ptr() % 16 == 0, t.stride()


def _compiled_runner(kernel, compiled, grid, given: int, fixed: tuple, options: dict):
    """A function launching ``compiled`` on the current stream of the device it was compiled on
    with the per-call arguments (a tuple of ``given``), the ``fixed`` ones and the named ones in
    ``options`` (constexprs and named fixed arguments); None where the release or mode offers no
    compiled launcher (the interpreter) or a parameter after the positional ones is not in ``options``."""
    names = getattr(kernel, "arg_names", None)
    if names is None or not hasattr(compiled, "__getitem__") or not hasattr(compiled, "packed_metadata"):
        return None
    rest = names[given + len(fixed):]
    if any(name not in options for name in rest):
        return None
    import triton
    from triton.runtime import driver

    # the fixed tensors as their addresses (the Launch keeps them alive): the launcher then skips
    # a method call and a driver query per tensor
    tail = tuple(map(_address, (*fixed, *(options[name] for name in rest))))
    through_hooks = compiled[grid]
    run, packed = compiled.run, compiled.packed_metadata  # run first: it loads the module and function
    function, device, hooks = compiled.function, torch.cuda.current_device(), triton.knobs.runtime
    stream_of = driver.active.get_current_stream  # the raw stream handle, as CompiledKernel[grid] takes it
    gx, gy, gz = grid

    def launch(given: tuple) -> None:
        args = (*(_address(a) for a in given), *tail)
        if hooks.launch_enter_hook is not None or hooks.launch_exit_hook is not None:
            through_hooks(*args)
            return
        # what CompiledKernel[grid] passes when no hook is set: no launch metadata, no hooks
        run(gx, gy, gz, stream_of(device), function, packed, None, None, None, *args)

    return launch
