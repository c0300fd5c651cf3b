"""Environment capture: the commit of a working tree whose file names are not UTF-8."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nox
import pytest

from harness.run import env


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_of_a_dirty_tree_with_a_file_name_that_is_not_utf8(tmp_path):
    """``git status`` prints the raw bytes of the name (core.quotePath false): still a commit, dirty."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, check=True).stdout.decode(errors="replace").strip()

    git("init", "-q")
    git("config", "core.quotePath", "false")
    name = os.path.join(os.fsencode(tmp_path), b"caf\xe9.txt")
    with open(name, "wb") as fh:
        fh.write(b"one\n")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    with open(name, "wb") as fh:
        fh.write(b"two\n")
    assert env.git_commit(tmp_path) == git("rev-parse", "HEAD") + "-dirty"


def test_optional_versions_read_the_metadata_and_say_none_for_what_is_missing():
    found = env.optional_versions(("pytest", "kvh-no-such-distribution"))
    assert found == {"pytest": pytest.__version__, "kvh-no-such-distribution": None}


def test_the_optional_distributions_are_the_extras_the_suites_and_peers_use():
    """Every package of pyproject's transformers and peers extras is in the environment table."""
    extras = nox.project.load_toml(Path(__file__).resolve().parents[1] / "pyproject.toml")["project"][
        "optional-dependencies"]
    names = {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0] for r in extras["transformers"] + extras["peers"]}
    assert names == set(env.OPTIONAL_DISTRIBUTIONS)
    assert set(env.capture("some-leg")["optional"]) == names
