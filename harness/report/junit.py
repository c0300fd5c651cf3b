"""JUnit XML: one ``<testsuite>`` per (leg, suite), one ``<testcase>`` per record.

``failed`` becomes ``<failure>``; ``error``, ``crashed`` and ``timeout`` become
``<error type="...">``; ``skipped`` becomes ``<skipped>``. Metrics travel as
testcase ``<properties>``. Control characters are replaced, so the file is always
well-formed XML 1.0.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from ..records import Record
from .fmt import clean_text, first_line
from .load import ResultSet
from .summary import suite_name


def _flat(metrics: dict, prefix: str = ""):
    for name, value in metrics.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def _testcase(parent: ET.Element, record: Record) -> None:
    case = ET.SubElement(
        parent,
        "testcase",
        classname=clean_text(suite_name(record).replace("/", ".")),
        name=clean_text(record.case),
        time=f"{float(record.duration_s or 0.0):.6f}",
    )
    properties = [("backend", record.backend), ("variant", record.variant), ("device", record.device)]
    properties += list(_flat(record.metrics))
    properties = [(k, v) for k, v in properties if v is not None]
    if properties:
        holder = ET.SubElement(case, "properties")
        for name, value in properties:
            ET.SubElement(holder, "property", name=clean_text(name), value=clean_text(value, 2000))
    message = clean_text(record.message or "")
    summary = first_line(record.message) or record.outcome
    if record.outcome == "failed":
        ET.SubElement(case, "failure", message=summary, type="failed").text = message
    elif record.outcome in ("error", "crashed", "timeout"):
        ET.SubElement(case, "error", message=f"{record.outcome}: {summary}", type=record.outcome).text = message
    elif record.outcome == "skipped":
        ET.SubElement(case, "skipped", message=summary)


def junit_tree(results: ResultSet) -> ET.ElementTree:
    root = ET.Element("testsuites", name="kv harness")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
    for run in results.runs:
        by_suite: dict[str, list[Record]] = {}
        for record in run.records:
            by_suite.setdefault(suite_name(record), []).append(record)
        for name, records in by_suite.items():
            counts = {
                "tests": len(records),
                "failures": sum(r.outcome == "failed" for r in records),
                "errors": sum(r.outcome in ("error", "crashed", "timeout") for r in records),
                "skipped": sum(r.outcome == "skipped" for r in records),
                "time": sum(float(r.duration_s or 0.0) for r in records),
            }
            suite = ET.SubElement(
                root,
                "testsuite",
                name=clean_text(f"{run.label} :: {name}"),
                hostname=clean_text(run.host),
                timestamp=clean_text(run.manifest.get("started") or ""),
                **{k: (f"{v:.6f}" if k == "time" else str(v)) for k, v in counts.items()},
            )
            for key, value in counts.items():
                totals[key] += value
            for record in records:
                _testcase(suite, record)
    for key, value in totals.items():
        root.set(key, f"{value:.6f}" if key == "time" else str(value))
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(path: str | os.PathLike, results: ResultSet) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    junit_tree(results).write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, path)
    return path
