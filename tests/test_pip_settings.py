"""The host's pip settings turned into a container build's pip.conf (harness/run/pip_settings.py)."""

from __future__ import annotations

import configparser

from harness.run import commands, pip_settings
from harness.run.pip_settings import BuildPipSettings, for_build

# `pip config list` on a host with a proxy's CA, a local wheel directory and two local indexes
LISTED = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/old.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple https://mirror.example.invalid/simple'
global.find-links='/opt/old-wheels'
install.find-links='/opt/install-wheels'
"""
HOST_FILES = {"/etc/ssl/certs/ca-certificates.crt", "/etc/xdg/pip/constraints.txt", "/opt/pypi/simple",
              "/opt/wheels"}


def _parsed(text: str) -> dict[str, dict[str, str]]:
    parser = configparser.ConfigParser()
    parser.read_string(text)
    return {name: dict(parser[name]) for name in parser.sections()}


def test_the_listing_is_read_as_section_key_value():
    settings = pip_settings.parse_config_list(LISTED + "not a setting\n:env:.odd=unquoted\n")
    assert settings[(":env:", "find-links")] == "/opt/wheels"
    assert settings[("global", "extra-index-url")] == "file:///opt/pypi/simple https://mirror.example.invalid/simple"
    assert settings[(":env:", "odd")] == "unquoted"
    assert len(settings) == 9


def test_variables_override_every_section_as_pip_lets_them():
    sections = pip_settings.effective_sections(pip_settings.parse_config_list(LISTED))
    assert sections["global"]["cert"] == "/etc/ssl/certs/ca-certificates.crt"
    assert sections["global"]["find-links"] == "/opt/wheels"
    assert sections["install"] == {"find-links": "/opt/wheels"}
    assert sections["global"]["default-timeout"] == "180"


def test_local_paths_of_locations():
    assert pip_settings.local_path("file:///opt/pypi/simple") == "/opt/pypi/simple"
    assert pip_settings.local_path("file:///opt/my%20wheels") == "/opt/my wheels"
    assert pip_settings.local_path("/opt/wheels") == "/opt/wheels"
    assert pip_settings.local_path("https://pypi.example.invalid/simple") is None


def test_a_builder_that_mounts_keeps_local_locations_and_mounts_each_once():
    built = for_build(pip_settings.parse_config_list(LISTED), mount_local=True, exists=HOST_FILES.__contains__)
    config = _parsed(built.config)
    assert config["global"] == {
        "cert": commands.SECRET_TARGETS[commands.CA_BUNDLE_SECRET],
        "constraint": "/etc/xdg/pip/constraints.txt",
        "extra-index-url": "file:///opt/pypi/simple https://mirror.example.invalid/simple",
        "find-links": "/opt/wheels",
        "default-timeout": "180"}
    assert config["install"] == {"find-links": "/opt/wheels"}
    assert built.ca_bundle == "/etc/ssl/certs/ca-certificates.crt"
    assert built.mounts == ("/etc/xdg/pip/constraints.txt", "/opt/pypi", "/opt/wheels")  # an index's parent
    assert built.left_out == ()
    assert built.config.startswith("[global]\n")


def test_a_builder_that_mounts_nothing_leaves_local_locations_out_and_says_which():
    built = for_build(pip_settings.parse_config_list(LISTED), mount_local=False, exists=HOST_FILES.__contains__)
    config = _parsed(built.config)
    assert config["global"] == {"cert": commands.SECRET_TARGETS[commands.CA_BUNDLE_SECRET],
                                "extra-index-url": "https://mirror.example.invalid/simple",
                                "default-timeout": "180"}
    assert "install" not in config and built.mounts == ()
    assert set(built.left_out) == {"constraint: /etc/xdg/pip/constraints.txt",
                                   "extra-index-url: file:///opt/pypi/simple", "find-links: /opt/wheels"}


def test_missing_host_files_are_left_out_not_mounted():
    listed = "global.cert='/gone.crt'\nglobal.find-links='/gone /opt/wheels'\n:env:.config-file='/x.conf'\n"
    built = for_build(pip_settings.parse_config_list(listed), mount_local=True, exists={"/opt/wheels"}.__contains__)
    assert _parsed(built.config) == {"global": {"find-links": "/opt/wheels"}}
    assert built.ca_bundle is None and built.mounts == ("/opt/wheels",)
    assert set(built.left_out) == {"cert: /gone.crt", "find-links: /gone"}


def test_the_secrets_name_the_written_config_and_the_ca_bundle():
    built = for_build(pip_settings.parse_config_list(LISTED), mount_local=True, exists=HOST_FILES.__contains__)
    assert built.secrets("/tmp/s/pip.conf") == {"pip_config": "/tmp/s/pip.conf",
                                                "ca_bundle": "/etc/ssl/certs/ca-certificates.crt"}
    assert BuildPipSettings("", None, (), ()).secrets("/tmp/s/pip.conf") == {}
    assert for_build({}, mount_local=True) == BuildPipSettings("", None, (), ())
