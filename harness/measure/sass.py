"""Static instruction budget of compiled Triton kernels, with no GPU: registers, spills and the
SASS of the hottest loop, by instruction class.

A kernel that is issue-bound (the fused decode: ncu counts about 4 to 5 instructions per element)
gets faster only by executing fewer instructions per element; this counts them from the
machine code itself, so a change can be judged on any machine, in CI, per commit. The kernel
is compiled ahead of time (:mod:`kvbits.aot`) and read back with the ``cuobjdump`` and
``nvdisasm`` that ship inside Triton's wheel.

    python -m harness.measure.sass [--arch 90] [--module kvbits.decode.launch] [--name decode_split] [--json]

prints, per specialization: registers, stack (spills), SASS instructions, the hottest loop's
length and its mix (bit operations, fp math, tensor-core MMA, memory, moves, integer/control),
and for the fused decode the loop's instructions per K/V element and thread. Straight-line
kernels (no loop) get their static count only: branches they skip make it an upper bound.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CLASSES = {  # SASS opcode (before the first '.') -> class
    "bits": ("LOP3", "SHF", "PRMT", "LOP", "SHL", "SHR", "BFE", "BFI", "BMSK", "SGXT", "POPC", "FLO"),
    "fp": ("FADD", "FMUL", "FFMA", "HADD2", "HMUL2", "HFMA2", "FMNMX", "HMNMX2", "MUFU", "F2FP", "F2F", "FSEL",
           "FSETP", "FCHK", "I2F", "F2I", "FRND", "DADD", "DMUL", "DFMA"),
    "mma": ("HMMA", "IMMA", "HGMMA", "IGMMA", "QGMMA", "DMMA"),
    "memory": ("LDG", "STG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "LDS", "STS", "LDSM", "STSM", "LD", "ST", "LDL",
               "STL", "ATOM", "ATOMG", "RED", "LDC", "UTMALDG", "UTMASTG", "SYNCS"),
    "moves": ("MOV", "IMAD.MOV", "UMOV", "SHFL", "S2R", "S2UR", "CS2R", "R2UR"),
}
_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_USAGE = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def tool(name: str) -> str:
    """Path of a CUDA binary utility shipped with Triton (``cuobjdump``, ``nvdisasm``)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not in this triton wheel ({path}); triton {triton.__version__}")
    return str(path)


def instruction_class(opcode: str) -> str:
    if opcode.startswith("IMAD.MOV"):
        return "moves"
    base = opcode.split(".")[0]
    for name, members in CLASSES.items():
        if base in members:
            return name
    return "int/control"


@dataclass
class Loop:
    """A backward branch's body: instructions from its target label to the branch."""

    label: str
    opcodes: list[str]

    @property
    def mix(self) -> Counter:
        return Counter(instruction_class(op) for op in self.opcodes)


@dataclass
class Budget:
    name: str
    arch: int
    registers: int
    stack_bytes: int
    shared_bytes: int
    instructions: int
    loops: list[Loop] = field(default_factory=list)

    @property
    def hottest(self) -> Loop | None:
        """The longest innermost-or-outer loop body (the main loop of a streaming kernel)."""
        return max(self.loops, key=lambda loop: len(loop.opcodes), default=None)

    def metrics(self, elements_per_iteration_per_thread: float | None = None) -> dict:
        """Figures for a record: registers, spills, counts, and the hottest loop's mix (shares)."""
        out = {"registers": self.registers, "stack_bytes": self.stack_bytes, "shared_bytes": self.shared_bytes,
               "sass_instructions": self.instructions}
        loop = self.hottest
        if loop is not None:
            n = len(loop.opcodes)
            out["loop_instructions"] = n
            out["loop_mix"] = {k: round(v / n, 3) for k, v in sorted(loop.mix.items())}
            if elements_per_iteration_per_thread:
                out["instructions_per_element"] = round(n / elements_per_iteration_per_thread, 3)
        return out


def parse_sass(text: str) -> tuple[int, list[Loop]]:
    """(instruction count, loops) of one kernel's nvdisasm listing."""
    opcodes: list[str] = []
    labels: dict[str, int] = {}
    loops: list[Loop] = []
    for line in text.splitlines():
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = len(opcodes)
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        opcode, operands = match.group(2), match.group(3)
        opcodes.append(opcode)
        if opcode.startswith("BRA"):
            target = _TARGET.search(operands)
            if target and target.group(1) in labels:  # the label came first: a backward branch
                loops.append(Loop(target.group(1), opcodes[labels[target.group(1)]:]))
    # a self-branch at the end (the trap loop after exit) is no loop of the kernel
    return len(opcodes), [loop for loop in loops if len(loop.opcodes) > 1]


def parse_usage(text: str) -> dict[str, tuple[int, int, int]]:
    """Function name -> (registers, stack bytes, shared bytes) from ``cuobjdump -res-usage``."""
    return {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in _USAGE.finditer(text)}


def budget_of_cubin(cubin: bytes, name: str, arch: int) -> Budget:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run([tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([tool("nvdisasm"), "-c", str(path)], capture_output=True, text=True,
                              check=True).stdout
    registers, stack, shared = next(iter(parse_usage(usage).values()), (0, 0, 0))
    count, loops = parse_sass(sass)
    return Budget(name, arch, registers, stack, shared, count, loops)


def budget(spec, arch: int = 90) -> Budget:
    """Compile ``spec`` (a :class:`kvbits.aot.AotSpec`) for ``sm_<arch>`` and read its budget.
    Needs TRITON_INTERPRET=0 before the kernels were imported."""
    from kvbits.aot import compile_spec

    compiled = compile_spec(spec, arch)
    return budget_of_cubin(compiled.asm["cubin"], spec.name, arch)


def elements_per_thread(spec) -> float | None:
    """K and V elements one thread consumes per iteration of a fused-decode split loop
    (2 * BLOCK_T * D over 32 * WARPS threads); None for kernels without such a loop."""
    c = spec.constexprs
    if {"BLOCK_T", "D", "WARPS"} <= set(c):
        return 2 * c["BLOCK_T"] * c["D"] / (32 * c["WARPS"])
    return None


def figures(spec, arch: int = 90) -> dict:
    """The JSON object ``--json`` prints for one specialization."""
    b = budget(spec, arch)
    return {"name": b.name, "arch": b.arch, **b.metrics(elements_per_thread(spec))}


def format_budget(b: Budget) -> str:
    line = (f"{b.name:<44} sm_{b.arch} {b.registers:>3} regs {b.stack_bytes:>4} B stack "
            f"{b.instructions:>6} SASS")
    loop = b.hottest
    if loop is not None:
        mix = " ".join(f"{k} {v / len(loop.opcodes):.0%}" for k, v in loop.mix.most_common())
        line += f"  hottest loop {len(loop.opcodes)}: {mix}"
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--module", nargs="+", default=None,
                        help="kernel modules (default: kvbits' and the harness's AOT modules)")
    parser.add_argument("--name", nargs="+", default=None,
                        help="only specializations whose name contains one of these")
    parser.add_argument("--json", action="store_true", help="one JSON object per specialization instead")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET must be 0 (or unset) to compile", file=sys.stderr)
        return 2
    os.environ["TRITON_INTERPRET"] = "0"
    from kvbits.aot import KERNEL_MODULES, collect_specs

    from . import HARNESS_KERNEL_MODULES

    specs, problems = collect_specs(args.module or (*KERNEL_MODULES, *HARNESS_KERNEL_MODULES))
    for problem in problems:
        print(f"import FAIL {problem}")
    for spec in specs:
        if args.name and not any(part in spec.name for part in args.name):
            continue
        if args.json:
            print(json.dumps(figures(spec, args.arch)), flush=True)
        else:
            print(format_budget(budget(spec, args.arch)), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
