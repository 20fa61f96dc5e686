"""Render a ``dapo report`` page in headless Chromium, check it loads cleanly, take a screenshot.

    python tests/screenshot_report.py [RUN_DIR] [--out report.png] [--html FILE.html]

Without RUN_DIR a synthetic run is made in a temporary directory. The check runs inside the
browser: a copy of the page gets a script that records script errors and every image that fails
to decode, and Chromium's --dump-dom prints the verdict. Exit status 0 when the page is clean,
1 when not, 77 when no Chromium is installed (pytest turns that into a skip: tests/test_report_chromium.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
SKIP = 77
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message || e.type)); }, true);
window.addEventListener('load', function () {
  var bad = [];
  document.querySelectorAll('img').forEach(function (img) {
    if (!img.complete || img.naturalWidth === 0) bad.push(img.alt || img.src.slice(0, 40));
  });
  var out = document.createElement('pre');
  out.id = '__probe';
  out.textContent = 'PROBE images=' + document.images.length + ' broken=' + JSON.stringify(bad) +
    ' errors=' + JSON.stringify(window.__errors) + ' width=' + document.documentElement.scrollWidth +
    ' height=' + document.documentElement.scrollHeight;
  document.body.appendChild(out);
});
</script>
"""


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and Path(env).is_file():
        return env
    for c in CANDIDATES:
        if Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return shutil.which("chromium")


def _chromium(binary: str, profile: Path, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    cmd = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check_page(html: Path, out_png: Path, binary: str, width: int = 1400) -> dict:
    """Load ``html`` in Chromium; returns {"images", "broken", "errors", "height", "screenshot"}."""
    html = Path(html).resolve()
    with tempfile.TemporaryDirectory(prefix="dapo-chromium-") as tmp:
        tmp = Path(tmp)
        probe = tmp / "probe.html"
        page = html.read_text(encoding="utf-8")
        probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
        r = _chromium(
            binary,
            tmp / "p1",
            f"--window-size={width},900",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probe.as_uri(),
        )
        m = re.search(
            r"PROBE images=(\d+) broken=(\[.*?\]) errors=(\[.*?\]) width=(\d+) height=(\d+)", r.stdout
        )
        if r.returncode != 0 or m is None:
            raise RuntimeError(f"chromium could not load {html}: rc={r.returncode}\n{r.stderr[-2000:]}")
        import json

        result = {
            "images": int(m.group(1)),
            "broken": json.loads(m.group(2)),
            "errors": json.loads(m.group(3)),
            "width": int(m.group(4)),
            "height": int(m.group(5)),
        }
        height = min(max(result["height"], 600), 12000)
        out_png.parent.mkdir(parents=True, exist_ok=True)
        r = _chromium(
            binary, tmp / "p2", f"--window-size={width},{height}", f"--screenshot={out_png}", html.as_uri()
        )
        if r.returncode != 0 or not out_png.is_file():
            raise RuntimeError(f"chromium screenshot failed: rc={r.returncode}\n{r.stderr[-2000:]}")
        result["screenshot"] = str(out_png)
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", help="a run directory (default: a synthetic run)")
    ap.add_argument("--out", default="report-screenshot.png", help="the screenshot (PNG)")
    ap.add_argument("--html", help="where to write the report (default: RUN_DIR/report.html)")
    args = ap.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        print("skip: no Chromium (apt-get install -y --no-install-recommends chromium)", file=sys.stderr)
        return SKIP
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from dapo.viewer.report import build_report
    from synthetic_runs import write_synthetic_run  # this folder: the script's own

    with tempfile.TemporaryDirectory(prefix="dapo-report-") as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else write_synthetic_run(Path(tmp) / "run", steps=20)
        html = build_report(run_dir, args.html)
        res = check_page(html, Path(args.out).resolve(), binary)
    ok = not res["broken"] and not res["errors"] and res["images"] > 0
    print(f"{'ok' if ok else 'FAILED'}: {html} {res}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
