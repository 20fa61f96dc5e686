"""The report page loads in headless Chromium with every image decoded and no script error
(tests/screenshot_report.py does the work; skipped when Chromium is not installed)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="the report needs the 'report' extra (matplotlib)")

import screenshot_report as shot  # noqa: E402  (after the skip: it imports the report)


@pytest.mark.skipif(
    shot.find_chromium() is None,
    reason="no Chromium: apt-get install -y --no-install-recommends chromium (or set CHROMIUM=/path)",
)
def test_report_renders_in_headless_chromium(tmp_path, capsys):
    png = tmp_path / "report.png"
    rc = shot.main(["--out", str(png), "--html", str(tmp_path / "report.html")])
    out = capsys.readouterr().out
    assert rc == 0, out
    # nine figures (the coverage figure among them), all decoded, no script error
    assert "'images': 9" in out and "'broken': []" in out and "'errors': []" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a real page, not a blank one


def test_probe_catches_a_broken_image(tmp_path):
    binary = shot.find_chromium()
    if binary is None:
        pytest.skip("no Chromium")
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><img alt="x" src="data:image/png;base64,AAAA"></body></html>')
    res = shot.check_page(bad, tmp_path / "bad.png", binary, width=400)
    assert res["images"] == 1 and res["broken"] == ["x"]
