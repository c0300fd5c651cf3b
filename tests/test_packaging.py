"""The project installs beside Hugging Face's hub-kernels loader, whose distribution ``kernels``
has a top-level import name of its own that transformers imports (and from 5.25 requires). Both
go into one virtualenv from wheels; neither overwrites the other's files; ``import kernels`` is
Hugging Face's (transformers takes it for its hub kernels) and ``import kvbits`` this project's,
whose transformers cache generates with the hub loader beside it: installed, and from a checkout
first on ``sys.path`` as the harness runs. Needs pip and PyPI."""

from __future__ import annotations

import base64
import hashlib
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What goes into the virtualenv beside kvbits: the hub loader in range of the environment's
# transformers (5.17, CI's pin; torch and transformers then come from the environment), or the
# release that requires the loader, with its own transformers, loader and hub
HUB_STACKS = {"hub-kernels-0.16": ["kernels==0.16.2", "huggingface-hub>=1.10,<2"],
              "transformers-5.25": ["transformers==5.25.0"]}

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
    """This environment without PYTHONPATH (a checkout on it holds the egg-info a wheel build leaves
    there, which pip would take for an installed kvbits) or PYTHONHOME."""
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


@pytest.mark.parametrize("stack", list(HUB_STACKS))
def test_installs_beside_hugging_faces_kernels(tmp_path, stack):
    pytest.importorskip("transformers", reason="the check generates with transformers (the 'transformers' extra)")
    packages = HUB_STACKS[stack]
    probe = _pip(Path(sys.executable), "download", "--no-deps", "-q", "-d", str(tmp_path / "probe"), packages[0],
                 cwd=tmp_path)
    if probe.returncode:
        pytest.skip(f"PyPI cannot be reached for {packages[0]}: {probe.stderr.strip().splitlines()[-1:]}")
    wheels = tmp_path / "wheels"
    built = _pip(Path(sys.executable), "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT), cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("kvbits-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    inner = Path(subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                                capture_output=True, text=True, check=True).stdout.strip())
    hub = _pip(python, "install", "-q", *packages, cwd=tmp_path)
    assert hub.returncode == 0, hub.stderr
    theirs = _recorded_files(inner, "kernels")
    ours = _pip(python, "install", "-q", "--no-deps", str(wheel), cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr

    assert sorted(p.name for p in inner.glob("kvbits*")) == ["kvbits", f"{wheel.name.split('-py')[0]}.dist-info"]
    listed = {Path(line.rsplit(",", 2)[0]).parts[0] for line in
              next(inner.glob("kvbits-*.dist-info/RECORD")).read_text().splitlines()}
    assert "kernels" not in listed, f"the wheel installs a top-level kernels package: {sorted(listed)}"
    changed = [str(p) for p, digest in theirs.items() if _sha256(p) != digest]
    assert not changed, f"installing kvbits changed the hub loader's files: {changed[:5]}"

    # torch and transformers come from this interpreter's environment, after the venv's own packages
    (inner / "zz_outer_environment.pth").write_text(site.getsitepackages()[0] + "\n")
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
