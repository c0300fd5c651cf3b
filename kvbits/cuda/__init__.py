"""CUDA and C++ sources of the kernels, and the one loader that builds them."""

from .loader import build_dir_for, extension_name, load_extension, source_path

__all__ = ["build_dir_for", "extension_name", "load_extension", "source_path"]
