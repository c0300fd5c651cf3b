"""Ahead-of-time compilation of every Triton kernel for chosen GPU targets, with no GPU.

Each kernel module lists ``AOT_SPECS``: one :class:`AotSpec` per kernel
specialization worth compiling (signature types as Triton spells them, e.g.
``"*u8"``, ``"*i32"``, ``"i32"``, ``"fp32"``; a tuple argument as a dict of its elements'
types, by the names the kernel unpacks them as, nested as the tuple is) and constexpr values
(by parameter name, or by the name of a tuple element that a launch specializes as one). The
interpreter accepts kernels that the compiler rejects, so CI compiles them all
(``python -m kvbits.aot --arch 80 90 100``). Another package's kernel modules that
list ``AOT_SPECS`` compile beside these when named with ``--also MODULE``.
Requires ``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import dataclass, field

KERNEL_MODULES = ("kvbits.packing", "kvbits.affine", "kvbits.decode.launch", "kvbits.decode.append", "kvbits.int8")


@dataclass(frozen=True)
class AotSpec:
    name: str
    kernel: object
    signature: dict  # parameter -> type, or for a tuple parameter a dict of its elements (module docstring)
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    aligned_pointers: bool = True  # compile as launched with 16-byte aligned tensors
    divisible_ints: tuple = ()  # int arguments (or tuple elements) that are multiples of 16 in its launches
    maxnreg: int | None = None  # register cap per thread, as the launch passes it (None: the compiler's choice)


def collect_specs(modules=KERNEL_MODULES) -> tuple[list[AotSpec], list[str]]:
    """Every module's specs, and a message per module that failed to import."""
    specs: list[AotSpec] = []
    problems: list[str] = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - a broken module must not hide the others
            problems.append(f"{module_name}: {type(exc).__name__}: {exc}")
            continue
        specs.extend(getattr(module, "AOT_SPECS", ()))
    return specs, problems


def _leaves(name: str, kind, path: tuple):
    """(index path, name, type) of each pointer or scalar in a signature entry, a tuple argument's
    elements at the paths by which Triton addresses them (parameter index, then element indices)."""
    if isinstance(kind, dict):
        for i, (element, element_kind) in enumerate(kind.items()):
            yield from _leaves(element, element_kind, (*path, i))
    else:
        yield path, name, kind


def _triton_type(kind, constexprs: dict):
    """A signature entry as Triton takes it: a tuple argument as the tuple of its elements' types,
    an element named in ``constexprs`` as a constexpr."""
    if isinstance(kind, dict):
        return tuple("constexpr" if element in constexprs else _triton_type(element_kind, constexprs)
                     for element, element_kind in kind.items())
    return kind


def compile_spec(spec: AotSpec, arch: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = spec.kernel
    if not hasattr(kernel, "fn") or type(kernel).__name__ == "InterpretedFunction":
        raise RuntimeError("AOT compilation needs TRITON_INTERPRET=0 before kernels are imported")
    names = list(kernel.arg_names)
    leaves = [leaf for arg, kind in spec.signature.items() for leaf in _leaves(arg, kind, (names.index(arg),))]
    signature = {arg: _triton_type(kind, spec.constexprs) for arg, kind in spec.signature.items()}
    constexprs = {}
    for name, value in spec.constexprs.items():
        path = next((path for path, leaf, _ in leaves if leaf == name and len(path) > 1), None)
        if path is None:
            signature[name] = "constexpr"
        constexprs[name if path is None else path] = value
    # as a launch does for 16-byte aligned tensors (every fresh torch allocation): pointers are
    # specialized as divisible by 16, which is what lets the compiler vectorize their accesses
    attrs = {path: [["tt.divisibility", 16]] for path, name, kind in leaves if name not in spec.constexprs
             and ((kind.startswith("*") and spec.aligned_pointers) or name in spec.divisible_ints)}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.maxnreg:
        options["maxnreg"] = spec.maxnreg
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[80, 90, 100])
    parser.add_argument("--module", nargs="+", default=list(KERNEL_MODULES), help="kernel modules to compile")
    # the caller names its own kernels: kvbits imports no package that builds on it
    parser.add_argument("--also", nargs="+", default=[], metavar="MODULE",
                        help="kernel modules of another package to compile as well (each lists AOT_SPECS)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("compiling ahead of time needs TRITON_INTERPRET=0 in the environment (on a machine without "
              "a GPU, importing kernels sets it to 1 when it is unset): TRITON_INTERPRET=0 python -m kvbits.aot",
              file=sys.stderr)
        return 2
    os.environ["TRITON_INTERPRET"] = "0"
    import triton

    specs, problems = collect_specs([*args.module, *args.also])
    failures = len(problems)
    for problem in problems:
        print(f"  import FAIL {problem}")
    print(f"triton {triton.__version__}: {len(specs)} kernel specializations x archs {args.arch}")
    for spec in specs:
        for arch in args.arch:
            start = time.perf_counter()
            try:
                compiled = compile_spec(spec, arch)
                regs = getattr(compiled, "n_regs", None)
                spills = getattr(compiled, "n_spills", None)
                status = f"ok   {len(compiled.asm.get('cubin', b''))} B cubin"
                if regs is not None:
                    status += f", {regs} regs, {spills} spills"
            except Exception as exc:  # noqa: BLE001 - report every failure, keep going
                failures += 1
                status = f"FAIL {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"  sm_{arch:<4} {spec.name:<40} {status} ({time.perf_counter() - start:.2f}s)")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
