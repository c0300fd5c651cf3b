"""The wheel holds ``kvbits`` alone, and installs beside distributions whose top-level names this
repository also uses:

- Hugging Face's hub-kernels loader, distribution ``kernels``, whose import name transformers
  imports (and from 5.25 requires). ``import kernels`` is Hugging Face's (transformers takes it
  for its hub kernels) and ``import kvbits`` this project's, whose transformers cache generates
  with the hub loader beside it: installed, and from a checkout first on ``sys.path`` as the
  harness runs.
- PyPI's ``harness``: this repository's harness runs from a checkout and is not in the wheel, so
  the two share a virtualenv with neither's files changed.

Each goes into one virtualenv with the wheel; neither overwrites the other's files. Needs pip and
PyPI."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What goes into the virtualenv beside kvbits: the hub loader in range of the environment's
# transformers (5.17, CI's pin; torch and transformers then come from the environment), or the
# release that requires the loader, with its own transformers, loader and hub
HUB_STACKS = {"hub-kernels-0.16": ["kernels==0.16.2", "huggingface-hub>=1.10,<2"],
              "transformers-5.25": ["transformers==5.25.0"]}
# PyPI's distribution named harness (a framework for server-less services, an sdist): the import
# name of this repository's harness, which therefore stays out of the wheel
PYPI_HARNESS = "harness==0.1.0"

CHECK = r"""
import sys
from pathlib import Path

venv, ours = Path(sys.prefix), Path(sys.argv[1])  # where kvbits must come from: installed or a checkout
import kernels
assert Path(kernels.__file__).is_relative_to(venv) and hasattr(kernels, "get_kernel"), kernels.__file__
import kvbits
assert Path(kvbits.__file__).resolve().is_relative_to(ours.resolve()), kvbits.__file__
from transformers.utils.import_utils import is_kernels_available
assert is_kernels_available(), "transformers does not take the hub loader for its kernels"

import torch
from transformers import LlamaConfig, LlamaForCausalLM
import kvbits.integrations.transformers as kv

torch.manual_seed(0)
config = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
                     head_dim=64, num_hidden_layers=1, vocab_size=64)
model = LlamaForCausalLM(config).eval()
model.set_attn_implementation(kv.ATTENTION_NAME)
ids = torch.randint(1, 64, (1, 40))
out = model.generate(ids, past_key_values=kv.KVBitsCache(config, max_cache_len=48, group_size=32),
                     max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
assert out.shape == (1, 43), out.shape
import transformers
print("ok", transformers.__version__, kernels.__file__, kvbits.__file__)
"""


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH (a checkout on it may hold the egg-info an editable
    install or a wheel build left there, which pip would take for an installed kvbits; and its
    harness would hide PyPI's) or PYTHONHOME."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _pip(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900, env=_clean_env())


def _recorded_files(site_packages: Path, dist: str) -> dict[Path, str]:
    """Each file a distribution's RECORD lists with a hash: its path and urlsafe-base64 sha256."""
    record = next(site_packages.glob(f"{dist}-*.dist-info/RECORD"))
    files = {}
    for line in record.read_text().splitlines():
        path, digest, _ = line.rsplit(",", 2)
        if digest.startswith("sha256="):
            files[site_packages / path] = digest[len("sha256="):]
    return files


def _sha256(path: Path) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def _download_or_skip(requirement: str, tmp_path: Path) -> Path:
    """The file pip downloads for ``requirement`` (no dependencies); skips where PyPI cannot be reached."""
    probe = _pip(Path(sys.executable), "download", "--no-deps", "-q", "-d", str(tmp_path / "probe"), requirement,
                 cwd=tmp_path)
    if probe.returncode:
        pytest.skip(f"PyPI cannot be reached for {requirement}: {probe.stderr.strip().splitlines()[-1:]}")
    (downloaded,) = (tmp_path / "probe").iterdir()
    return downloaded


@pytest.fixture(scope="module")
def kvbits_wheel(tmp_path_factory):
    """Builds the wheel on first call, once for the module's tests. It builds from a copy of
    pyproject.toml, README.md and every top-level package of the checkout (what pyproject.toml
    lists or might): a build/ an earlier build left in the checkout would otherwise go into the
    wheel whole, packages since dropped from pyproject.toml included (setuptools packs what it
    finds there)."""
    built: list[Path] = []

    def build() -> Path:
        if not built:
            source, wheels = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheels")
            for name in ("pyproject.toml", "README.md"):
                shutil.copy2(ROOT / name, source / name)
            for package in (init.parent for init in ROOT.glob("*/__init__.py")):
                shutil.copytree(package, source / package.name, ignore=shutil.ignore_patterns("__pycache__"))
            done = _pip(Path(sys.executable), "wheel", "--no-deps", "-q", "-w", str(wheels), str(source), cwd=source)
            assert done.returncode == 0, done.stderr
            built.extend(wheels.glob("kvbits-*.whl"))
        (wheel,) = built
        return wheel

    return build


def _fresh_venv(env_dir: Path) -> tuple[Path, Path]:
    """A new virtualenv with pip: its python and its site-packages."""
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    inner = Path(subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                                capture_output=True, text=True, check=True).stdout.strip())
    return python, inner


def _installed_top_level(site_packages: Path, dist: str) -> set[str]:
    """The first part of every path a distribution's RECORD lists."""
    record = next(site_packages.glob(f"{dist}-*.dist-info/RECORD"))
    return {Path(line.rsplit(",", 2)[0]).parts[0] for line in record.read_text().splitlines()}


def _changed(files: dict[Path, str]) -> list[str]:
    return [str(p) for p, digest in files.items() if not p.exists() or _sha256(p) != digest]


def _use_outer_environment(site_packages: Path) -> None:
    """torch (and transformers) come from this interpreter's environment, after the venv's own packages."""
    (site_packages / "zz_outer_environment.pth").write_text(site.getsitepackages()[0] + "\n")


BESIDE_HARNESS = r"""
import sys
from pathlib import Path

venv = Path(sys.prefix)
import harness
assert Path(harness.__file__).is_relative_to(venv) and harness.__version__ == "0.1.0", harness.__file__
import torch
import kvbits
assert Path(kvbits.__file__).is_relative_to(venv), kvbits.__file__
codes = torch.arange(64, dtype=torch.uint8) % 8
assert torch.equal(kvbits.unpack_bits(kvbits.pack_bits(codes, bits=3, backend="torch"), bits=3, backend="torch"), codes)
print("ok", harness.__file__, kvbits.__file__)
"""


def test_the_wheel_installs_beside_pypis_harness(tmp_path, kvbits_wheel):
    sdist = _download_or_skip(PYPI_HARNESS, tmp_path)
    wheel = kvbits_wheel()
    dist_info = f"{wheel.name.split('-py')[0]}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        assert {Path(name).parts[0] for name in archive.namelist()} == {"kvbits", dist_info}

    python, inner = _fresh_venv(tmp_path / "venv")
    theirs = _pip(python, "install", "-q", "--no-deps", str(sdist), cwd=tmp_path)
    assert theirs.returncode == 0, theirs.stderr
    their_files = _recorded_files(inner, "harness")
    assert any(p.parent.name == "harness" for p in their_files)  # the package itself, not only its scripts
    ours = _pip(python, "install", "-q", "--no-deps", str(wheel), cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr

    assert _installed_top_level(inner, "kvbits") == {"kvbits", dist_info}
    assert not _changed(their_files), f"installing kvbits changed PyPI's harness: {_changed(their_files)[:5]}"
    _use_outer_environment(inner)
    both = subprocess.run([str(python), "-c", BESIDE_HARNESS], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=_clean_env())
    assert both.returncode == 0, both.stdout + both.stderr
    assert both.stdout.startswith("ok")


@pytest.mark.parametrize("stack", list(HUB_STACKS))
def test_installs_beside_hugging_faces_kernels(tmp_path, stack, kvbits_wheel):
    pytest.importorskip("transformers", reason="the check generates with transformers (the 'transformers' extra)")
    packages = HUB_STACKS[stack]
    _download_or_skip(packages[0], tmp_path)
    wheel = kvbits_wheel()

    env_dir = tmp_path / "venv"
    python, inner = _fresh_venv(env_dir)
    hub = _pip(python, "install", "-q", *packages, cwd=tmp_path)
    assert hub.returncode == 0, hub.stderr
    theirs = _recorded_files(inner, "kernels")
    ours = _pip(python, "install", "-q", "--no-deps", str(wheel), cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr

    assert sorted(p.name for p in inner.glob("kvbits*")) == ["kvbits", f"{wheel.name.split('-py')[0]}.dist-info"]
    listed = _installed_top_level(inner, "kvbits")
    assert "kernels" not in listed, f"the wheel installs a top-level kernels package: {sorted(listed)}"
    assert not _changed(theirs), f"installing kvbits changed the hub loader's files: {_changed(theirs)[:5]}"

    _use_outer_environment(inner)
    clean = _clean_env()
    installed = subprocess.run([str(python), "-c", CHECK, str(env_dir)], cwd=tmp_path, capture_output=True, text=True,
                               timeout=600, env=clean)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert installed.stdout.startswith("ok")
    if stack == "transformers-5.25":
        assert installed.stdout.split()[1] == "5.25.0", installed.stdout  # the venv's own, not the environment's
    # the checkout first on sys.path, as the harness runs the suites: it must hide neither
    checkout = subprocess.run([str(python), "-c", CHECK, str(ROOT / "kvbits")], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, env={**clean, "PYTHONPATH": str(ROOT)})
    assert checkout.returncode == 0, checkout.stdout + checkout.stderr
    assert checkout.stdout.startswith("ok")
