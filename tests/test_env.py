"""Environment capture: the commit of a working tree whose file names are not UTF-8."""

from __future__ import annotations

import os
import shutil
import subprocess

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
