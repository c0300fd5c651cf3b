"""The container image and the CI workflows agree with what the harness installs and writes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from harness.run import ab, commands

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("pin", [commands.ACTIVATION_MODEL, [commands.TRANSFORMERS]], ids=["activation-model",
                                                                                        "transformers"])
def test_the_image_installs_what_the_harness_pins(pin):
    text = (ROOT / "docker" / "Dockerfile").read_text()
    install = "pip install --no-cache-dir " + shlex.join(pin)
    assert re.search(rf"^ && {re.escape(install)} \\$", text, flags=re.M), install


def _report_uploads(name: str, page: str) -> list[set[str]]:
    """The ``reports/...`` paths of each upload step of workflow ``name`` that carries ``page``."""
    text = (ROOT / ".github" / "workflows" / name).read_text()
    steps = [s for s in text.split("\n      - ") if "actions/upload-artifact@" in s]
    uploads = [set(re.findall(r"^\s+(reports/\S+)$", step, flags=re.M)) for step in steps]
    return [paths for paths in uploads if page in paths]


@pytest.mark.parametrize(("workflow", "kind"), [("ci.yml", "tests"), ("gpu-verify.yml", "gpu_verify")])
def test_the_report_artifact_holds_what_the_pipeline_writes(workflow, kind):
    cmd = commands.report_command("python", ["reports/runs/x"], reports_dir="reports", family=kind)
    written = {cmd[cmd.index(flag) + 1] for flag in ("-o", "--junit", "--summary-md")}
    written.add(f"reports/{kind}-steps.json")
    (paths,) = _report_uploads(workflow, commands.report_paths(kind, "reports")["html"])
    assert {p for p in paths if not p.endswith("/")} == written
    assert "reports/runs/" in paths


def _gpu_verify_steps() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "gpu-verify.yml").read_text())
    return workflow["jobs"]["gpu-verify"]["steps"]


def test_pushes_to_main_run_the_ab_against_the_previous_commit_after_gpu_verify():
    steps = _gpu_verify_steps()
    runs = [str(step.get("run", "")) for step in steps]
    verify = next(i for i, run in enumerate(runs) if run.endswith("-- gpu_verify"))
    (ab_step,) = [i for i, run in enumerate(runs) if "-- ab " in run]
    assert runs[ab_step] == 'nox -s "$SESSION" -- ab HEAD~1'
    assert steps[ab_step]["env"]["SESSION"] == steps[verify]["env"]["SESSION"]  # in the leg's container
    assert ab_step > verify and steps[ab_step]["if"] == "github.event_name == 'push'"
    summary = next(i for i, step in enumerate(steps) if step.get("name") == "Summary")
    assert ab_step < summary  # its table is in ab-summary.md when the job summary is written
    checkout = next(step for step in steps if str(step.get("uses", "")).startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] >= 2  # HEAD~1 is there to check out


def test_the_ab_artifact_holds_what_the_ab_writes():
    steps = _gpu_verify_steps()
    uploads = [step for step in steps if str(step.get("uses", "")).startswith("actions/upload-artifact@")
               and f"reports/{ab.AB_FILE}" in step["with"]["path"]]
    (upload,) = uploads
    assert set(upload["with"]["path"].split()) == {f"reports/{ab.AB_FILE}", f"reports/{ab.AB_PAGE}"}
    assert upload["if"] == "always() && github.event_name == 'push'"
    names = [step["with"]["name"] for step in steps if str(step.get("uses", "")).startswith("actions/upload-artifact@")]
    assert len(set(names)) == len(names)  # one artifact name each


@pytest.mark.parametrize(("workflow", "kind"), [("ci.yml", "tests"), ("gpu-verify.yml", "gpu_verify")])
def test_the_job_summary_is_the_family_s_own(workflow, kind):
    text = (ROOT / ".github" / "workflows" / workflow).read_text()
    summary = text[text.index("- name: Summary"):]
    assert f"cat {commands.report_paths(kind, 'reports')['summary']} >>" in summary


def test_ci_builds_the_cpu_container_after_the_tests_and_says_when_it_cannot():
    text = (ROOT / ".ci" / "run").read_text()
    tests = text.index("python3 -m nox -s tests -- --all-legs")
    container = text.index("KVH_CONTAINER_BASE=debootstrap python3 -m nox -s container_cpu -- verify")
    assert tests < container
    assert "apt-get install -y -qq buildah debootstrap" in text
    assert 'echo "SKIPPED: the CPU container was not built or run' in text
