"""The container image and the CI workflows agree with what the harness installs and writes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from harness.run import commands

ROOT = Path(__file__).resolve().parents[1]


def test_the_image_installs_the_activation_model_as_the_harness_pins_it():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    install = "pip install --no-cache-dir " + shlex.join(commands.ACTIVATION_MODEL)
    assert re.search(rf"^ && {re.escape(install)} \\$", text, flags=re.M), install


def _report_uploads(name: str) -> list[set[str]]:
    """The ``reports/...`` paths of each upload step of workflow ``name`` that carries the page."""
    text = (ROOT / ".github" / "workflows" / name).read_text()
    steps = [s for s in text.split("\n      - ") if "actions/upload-artifact@" in s]
    uploads = [set(re.findall(r"^\s+(reports/\S+)$", step, flags=re.M)) for step in steps]
    return [paths for paths in uploads if "reports/report.html" in paths]


@pytest.mark.parametrize(("workflow", "kind"), [("ci.yml", "tests"), ("gpu-verify.yml", "gpu_verify")])
def test_the_report_artifact_holds_what_the_pipeline_writes(workflow, kind):
    cmd = commands.report_command("python", ["reports/runs/x"], reports_dir="reports")
    written = {cmd[cmd.index(flag) + 1] for flag in ("-o", "--junit", "--summary-md")}
    written.add(f"reports/{kind}-steps.json")
    (paths,) = _report_uploads(workflow)
    assert {p for p in paths if not p.endswith("/")} == written
    assert "reports/runs/" in paths
