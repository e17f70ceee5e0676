"""Plots reach the Prefect UI as images: a PNG becomes a data: URI in a Markdown artifact, a missing
one is skipped."""

from __future__ import annotations

import base64

from tasks.common import markdown_image, publish_plots


def test_a_png_is_embedded_as_a_data_uri_the_browser_can_show(tmp_path):
    png = tmp_path / "curve.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    image = markdown_image(png, "Scaling curve")
    assert image.startswith("![Scaling curve](data:image/png;base64,") and image.endswith(")")
    assert base64.b64decode(image.split("base64,")[1][:-1]) == png.read_bytes()


def test_publish_plots_skips_missing_files_and_publishes_nothing_without_plots(
    tmp_path, monkeypatch
):
    published: list[tuple[str, str]] = []
    monkeypatch.setattr(
        "tasks.common.publish_markdown", lambda key, md, description="": published.append((key, md))
    )
    png = tmp_path / "throughput.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    markdown = publish_plots(
        "night-plots", {"Throughput": png, "Accept length": tmp_path / "missing.png"}
    )
    assert markdown is not None and "## Throughput" in markdown and "Accept length" not in markdown
    assert published == [("night-plots", markdown)]
    assert publish_plots("night-plots", {"Training": None}) is None and len(published) == 1
