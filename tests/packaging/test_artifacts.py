"""What ``scripts/dist`` puts in the sdist and the wheel: files, licence, metadata and tag."""

from __future__ import annotations

import importlib.machinery
import platform
import re
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import PurePosixPath

import pytest
import trove_classifiers

from orbitive._core._native import EXTRA_MODULES

from ._project import PYPROJECT, ROOT, VERSION, tracked_files
from ._smoke import C_MODULES
from .conftest import DIST_TIMEOUT, Release

pytestmark = [pytest.mark.slow, pytest.mark.timeout(DIST_TIMEOUT)]

SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# What the sdist holds at its top level: the build's inputs, LICENSE and what setuptools adds.
SDIST_TOP_LEVEL = {
    "LICENSE",
    "MANIFEST.in",
    "PKG-INFO",
    "README.md",
    "pyproject.toml",
    "setup.cfg",
    "setup.py",
    "src",
}


def sdist_members(release: Release) -> dict[str, bytes]:
    """The sdist's files by their path inside its top folder, with their bytes."""
    prefix = f"orbitive-{VERSION}/"
    with tarfile.open(release.sdist) as archive:
        members = {}
        for member in archive.getmembers():
            assert member.name.startswith(prefix) or member.name == prefix[:-1], member.name
            extracted = archive.extractfile(member)
            if extracted is not None:
                members[member.name.removeprefix(prefix)] = extracted.read()
    return members


def wheel_members(release: Release) -> dict[str, bytes]:
    """The wheel's files by their path, with their bytes."""
    with zipfile.ZipFile(release.wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}


def metadata_and_licence(release: Release, artifact: str) -> tuple[Message, bytes]:
    """The core metadata (PKG-INFO or METADATA) and the LICENSE bytes that ``artifact`` carries."""
    if artifact == "sdist":
        members = sdist_members(release)
        return Parser().parsestr(members["PKG-INFO"].decode()), members["LICENSE"]
    members = wheel_members(release)
    info = f"orbitive-{VERSION}.dist-info"
    metadata = Parser().parsestr(members[f"{info}/METADATA"].decode())
    return metadata, members[f"{info}/licenses/LICENSE"]


@pytest.mark.parametrize("artifact", ["sdist", "wheel"])
def test_each_artifact_carries_the_licence_and_the_metadata(
    release: Release, artifact: str
) -> None:
    metadata, licence = metadata_and_licence(release, artifact)
    assert licence == (ROOT / "LICENSE").read_bytes()
    assert b"MIT License" in licence
    assert metadata["License-Expression"] == PYPROJECT["project"]["license"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Requires-Python"] == f">={SUPPORTED_PYTHONS[0]}"
    # Nothing is published at an address yet, so the metadata names none (no
    # [project.urls]; the README links relatively).
    assert "urls" not in PYPROJECT["project"]
    assert metadata.get_all("Project-URL") is None
    classifiers = metadata.get_all("Classifier") or []
    assert sorted(set(classifiers) - trove_classifiers.classifiers) == []
    versions = [
        line.removeprefix("Programming Language :: Python :: ")
        for line in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", line)
    ]
    assert versions == list(SUPPORTED_PYTHONS)
    for expected in ("Operating System :: POSIX :: Linux", "Typing :: Typed"):
        assert expected in classifiers
    assert any(line.startswith("Topic :: ") for line in classifiers)
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload() == (ROOT / "README.md").read_text()


def test_the_sdist_holds_the_package_sources_and_no_tests(release: Release) -> None:
    members = sdist_members(release)
    assert {PurePosixPath(name).parts[0] for name in members} == SDIST_TOP_LEVEL
    missing = sorted(set(tracked_files("src")) - set(members))
    assert missing == []


def test_the_wheel_holds_the_package_and_its_c_modules_but_not_their_sources(
    release: Release,
) -> None:
    names = set(wheel_members(release))
    sources = [name.removeprefix("src/") for name in tracked_files("src")]
    python_files = {name for name in sources if name.endswith((".py", ".pyi", "py.typed"))}
    assert sorted(python_files - names) == []
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    modules = {module.replace(".", "/") + suffix for module in (*C_MODULES, *EXTRA_MODULES)}
    assert sorted(modules - names) == []
    assert sorted(name for name in names if name.endswith((".c", ".h"))) == []


def test_the_wheel_is_manylinux_tagged_with_the_oldest_glibc_it_needs(release: Release) -> None:
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    match = re.fullmatch(
        rf"orbitive-{re.escape(VERSION)}-{tag}-{tag}-(manylinux_\d+_\d+_{platform.machine()})\.whl",
        release.wheel.name,
    )
    assert match is not None, release.wheel.name
    shown = subprocess.run(
        [str(release.tools / "auditwheel"), "show", str(release.wheel)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # auditwheel names the most compatible platform tag the wheel's C modules allow.
    oldest = re.search(
        r'consistent with the following platform tag: "([^"]+)"', " ".join(shown.split())
    )
    assert oldest is not None, shown
    assert match.group(1) == oldest.group(1)
