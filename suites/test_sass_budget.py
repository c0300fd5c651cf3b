"""Static instruction budget of the fused decode and the quantize kernels, from their sm_90
machine code, on any machine (harness/measure/sass.py): registers, spills, and for the decode split
loop its SASS instructions per K/V element and thread, the figure an issue-bound kernel is
judged by (ncu on the H200 counts about as many as the static figure). Figures only:
the cases fail when a kernel does not compile or its machine code cannot be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbits._runtime import triton_interpreted

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # specialization -> what its figures stand for
    "decode_split_fp16_d128_b3_g64_gqa1_t64w1_s64r192": "decode, 3 bits, D=128, MHA (the default: 64 fp sinks, "
                                                        "a 128-token fp window)",
    "decode_split_fp16_d128_b3_g64_gqa8_t64w1_s64r192": "decode, 3 bits, D=128, GQA 8 (the default)",
    "decode_split_fp16_d128_b3_g64_gqa1_t64w1": "decode, 3 bits, D=128, MHA, no fp sinks or window",
    "decode_split_fp16_d128_b3_g64_gqa8_t64w1": "decode, 3 bits, D=128, GQA 8, no fp sinks or window",
    "quantize_k_float16_b3_g64_float16": "affine quantize of K, 3 bits, G=64",
    "quantize_v_float16_b3_g64_float16": "affine quantize of V, 3 bits, G=64",
}


MODULES = ("kvbits.decode.launch", "kvbits.affine")


def compiled_budget(name: str) -> dict:
    """One specialization compiled for sm_90. The compiler needs TRITON_INTERPRET=0 before the
    kernels are imported: in the interpreter the case compiles in a child process of its own
    (one case per child, so that the cases spread over pytest-xdist workers); where kernels
    are compiled anyway (a GPU run) it compiles here, from Triton's cache when warm."""
    if not triton_interpreted():
        from harness.measure.sass import figures
        from kvbits.aot import collect_specs

        specs, problems = collect_specs(MODULES)
        spec = next((s for s in specs if s.name == name), None)
        if spec is None:
            return {"returncode": 1, "stderr": "; ".join(problems) or f"no specialization {name}", "found": {}}
        return {"returncode": 0, "stderr": "", "found": {name: figures(spec, 90)}}
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "harness.measure.sass", "--arch", "90", "--json",
                          "--module", *MODULES, "--name", name],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    found = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            found[item["name"]] = item
    return {"returncode": out.returncode, "stderr": out.stderr[-3000:], "found": found}


@pytest.mark.parametrize("name", list(CASES))
def test_instruction_budget(record, name):
    record.backend, record.variant, record.device = "triton", name, "sm_90 (static)"
    budgets = compiled_budget(name)
    assert budgets["returncode"] == 0, budgets["stderr"]
    item = budgets["found"].get(name)
    assert item is not None, f"{name} was not compiled; got {sorted(budgets['found'])}"
    figures = {k: v for k, v in item.items() if k not in ("name", "arch")}
    record.add(what=CASES[name], **figures)
    assert item["registers"] > 0 and item["sass_instructions"] > 0
    if name.startswith("decode_split"):
        assert item["loop_instructions"] > 0 and item["instructions_per_element"] > 0, item
