"""Kernel launches with fixed arguments, through the compiled kernel's own launcher.

A decode step launches the same kernels with the same arguments but a few (q, k, v, the output)
every time. Triton's JIT launch specializes every argument on each call (tens of microseconds
of host time for 45 arguments); :class:`Launch` does that once: after the first call through the
JIT function has compiled the kernel, it calls the compiled kernel's launcher
(``CompiledKernel[grid](*args)``) with the arguments in parameter order, as long as the per-call
arguments specialize as they did then (the key the caller passes). Where a Triton release's
launcher takes its arguments otherwise (a TypeError), it goes back to the JIT launch for good.
"""

from __future__ import annotations

import torch

from .._runtime import triton_interpreted


class Launch:
    """One kernel launch whose arguments are fixed but for the first few, given per call with a
    key of how the compiler specializes them (pointer alignment, strides)."""

    def __init__(self, kernel, grid, fixed: tuple, options: dict):
        self.kernel, self.grid, self.fixed, self.options = kernel, grid, fixed, options
        self._runner = None  # (key, the compiled kernel's launcher, the fixed arguments and constexprs)
        self._direct = not triton_interpreted()  # False once a release's launcher turned the call down

    def __call__(self, key: tuple, *given) -> None:
        runner = self._runner
        if runner is not None and runner[0] == key:
            try:
                runner[1](*(_address(a) for a in given), *runner[2])
                return
            except TypeError:  # this release's launcher takes its arguments otherwise
                self._runner, self._direct = None, False
        compiled = self.kernel[self.grid](*given, *self.fixed, **self.options)
        if self._direct and (runner is None or runner[0] != key):
            found = _compiled_runner(self.kernel, compiled, self.grid, len(given) + len(self.fixed), self.options)
            # the fixed tensors as their addresses (self.fixed keeps them alive): the launcher then
            # skips a method call and a driver query per tensor
            self._runner = None if found is None else (key, found[0], (*map(_address, self.fixed), *found[1]))
            self._direct = found is not None


def _address(arg):
    """A tensor argument as its device address (an int the launcher takes as it is); others as given."""
    return arg.data_ptr() if isinstance(arg, torch.Tensor) else arg


def specialization(t: torch.Tensor) -> tuple:
    """What a launch specializes a tensor argument on (its pointer's 16-byte alignment) and its
    strides, which the launches pass beside it."""
    return t.data_ptr() % 16 == 0, t.stride()


def _compiled_runner(kernel, compiled, grid, positional: int, options: dict):
    """(launcher, constexpr values in parameter order) of a compiled kernel whose parameters
    after the positional ones are all constexprs given in ``options``; None where the release or
    mode offers none (the interpreter)."""
    names = getattr(kernel, "arg_names", None)
    if names is None or not hasattr(compiled, "__getitem__"):
        return None
    rest = names[positional:]
    if any(name not in options for name in rest):
        return None
    return compiled[grid], tuple(options[name] for name in rest)


