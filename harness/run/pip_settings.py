"""The host's pip settings, made fit for a container build.

A build reaches the package index as the host does only with the host's pip settings: its index
URLs, its certificate bundle (a TLS-inspecting proxy's CA, say) and the local wheel directories
it names. ``pip config list`` prints them all, from every config file and ``PIP_*`` variable;
:func:`for_build` turns them into one pip.conf for the build, with the certificate at its place
among the build secrets (``harness.run.commands.SECRET_TARGETS``) and each local path either kept
(the builder mounts it at the same place) or left out (a builder that mounts none). Pure: nothing
here runs pip or reads a file; ``exists`` is asked about paths.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from .commands import CA_BUNDLE_SECRET, PIP_CONFIG_SECRET, SECRET_TARGETS

ENV_SECTION = ":env:"  # pip's name for settings from PIP_* variables (and PIP_CONFIG_FILE)
# Settings whose values are whitespace-separated locations: URLs, or paths on the host.
LOCATION_KEYS = ("find-links", "index-url", "extra-index-url", "constraint")
# Of those, the indexes: a local index's pages link to files beside them (``simple/`` next to
# ``files/`` or ``packages/``), so its parent directory is what the build must see.
INDEX_KEYS = ("index-url", "extra-index-url")
# Settings that mean nothing inside the build.
HOST_ONLY_KEYS = ("config-file",)


def parse_config_list(text: str) -> dict[tuple[str, str], str]:
    """``pip config list`` output (``section.key='value'`` lines) as {(section, key): value}."""
    settings = {}
    for line in text.splitlines():
        name, sep, quoted = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not (sep and dot and section and key):
            continue
        try:
            value = ast.literal_eval(quoted)
        except (ValueError, SyntaxError):
            value = quoted
        settings[(section, key)] = str(value)
    return settings


def effective_sections(settings: Mapping[tuple[str, str], str]) -> dict[str, dict[str, str]]:
    """The settings by config-file section, the variables' ones merged in: pip lets a ``PIP_*``
    variable override a file's ``[global]`` and command sections alike."""
    env = {key: value for (section, key), value in settings.items() if section == ENV_SECTION}
    sections: dict[str, dict[str, str]] = {"global": {}}
    for (section, key), value in settings.items():
        if section != ENV_SECTION:
            sections.setdefault(section, {})[key] = env.get(key, value)
    sections["global"].update(env)
    return {name: values for name, values in sections.items() if values}


def local_path(location: str) -> str | None:
    """The host path a location names (a path or a ``file://`` URL); None for a remote URL."""
    if location.startswith("file:"):
        return unquote(urlparse(location).path)
    if "://" in location:
        return None
    return os.path.abspath(location)


@dataclass(frozen=True)
class BuildPipSettings:
    """``config``: the pip.conf a build reads (empty: pip's defaults); ``ca_bundle``: the host file
    its ``cert`` stands for; ``mounts``: host paths the build must see at the same place;
    ``left_out``: ``key: location`` settings dropped (not found, or not mountable)."""

    config: str
    ca_bundle: str | None
    mounts: tuple[str, ...]
    left_out: tuple[str, ...]

    def secrets(self, config_file: str) -> dict[str, str]:
        """Build secret id -> host file, with the rendered ``config`` written to ``config_file``."""
        if not self.config:
            return {}
        secrets = {PIP_CONFIG_SECRET: config_file}
        if self.ca_bundle:
            secrets[CA_BUNDLE_SECRET] = self.ca_bundle
        return secrets


def _kept_locations(key: str, value: str, *, mount_local: bool, exists: Callable[[str], bool],
                    mounts: list[str], left_out: list[str]) -> str:
    kept = []
    for location in value.split():
        path = local_path(location)
        if path is None:
            kept.append(location)
        elif mount_local and exists(path):
            kept.append(location)
            mount = os.path.dirname(path.rstrip("/")) if key in INDEX_KEYS else path
            if mount not in mounts:
                mounts.append(mount)
        else:
            left_out.append(f"{key}: {location}")
    return " ".join(kept)


def for_build(settings: Mapping[tuple[str, str], str], *, mount_local: bool,
              exists: Callable[[str], bool] = os.path.exists) -> BuildPipSettings:
    """The host's settings (:func:`parse_config_list`) as a build's pip.conf. ``mount_local``: the
    builder mounts host paths (buildah's ``--volume``), so local indexes and wheel directories
    stay; otherwise (docker build) they are left out and named in ``left_out``."""
    mounts: list[str] = []
    left_out: list[str] = []
    ca_bundle = None
    rendered: dict[str, dict[str, str]] = {}
    for section, values in effective_sections(settings).items():
        for key, value in values.items():
            if key in HOST_ONLY_KEYS:
                continue
            if key == "cert":
                if exists(value):
                    ca_bundle = value
                    rendered.setdefault(section, {})[key] = SECRET_TARGETS[CA_BUNDLE_SECRET]
                else:
                    left_out.append(f"cert: {value}")
                continue
            if key in LOCATION_KEYS:
                value = _kept_locations(key, value, mount_local=mount_local, exists=exists,
                                        mounts=mounts, left_out=left_out)
                if not value:
                    continue
            rendered.setdefault(section, {})[key] = value
    return BuildPipSettings(render(rendered), ca_bundle, tuple(mounts), tuple(left_out))


def render(sections: Mapping[str, Mapping[str, str]]) -> str:
    """A pip.conf of ``sections`` (``[global]`` first)."""
    names = sorted(sections, key=lambda name: (name != "global", name))
    return "\n".join(_section(name, sections[name].items()) for name in names if sections[name])


def _section(name: str, items: Iterable[tuple[str, str]]) -> str:
    return f"[{name}]\n" + "".join(f"{key} = {value}\n" for key, value in items)
