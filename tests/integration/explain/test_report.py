"""``autoplan report``: one self-contained HTML file, rendered in a real headless browser,
whose figures are drawn (checked from the screenshot's pixels).

The page's own styles are greys only, so saturated pixels in the screenshot come from the
embedded figures; the same page with its images removed is the control that must have
none. The browser test is skipped, saying so, only where no chromium can be found
(``.ci/run`` installs Debian's where missing)."""

import re
import shutil
import subprocess

import pytest
from conftest import EXAMPLES

from autoplan.cli import main

MLP = str(EXAMPLES / "mlp.py")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    plan, html = folder / "plan.json", folder / "report.html"
    assert main(["suggest", MLP, "--mesh", "2x4", "--out", str(plan), "--no-cache"]) == 0
    assert main(["report", MLP, str(plan), "--out", str(html)]) == 0
    return html


@pytest.mark.slow
def test_the_report_is_one_self_contained_file(report):
    text = report.read_text()
    images = re.findall(r'<img [^>]*src="([^"]*)"', text)
    assert len(images) == 3 and all(src.startswith("data:image/png;base64,") for src in images)
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing fetched to open it
    assert "layout per module" in text and "alternatives per block" in text and "what binds" in text


def _browser():
    return next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)


def _screenshot(browser, html, png):
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={png}", "--window-size=1200,2000", html.resolve().as_uri()],
        check=True, capture_output=True, timeout=180,
    )
    import matplotlib.image

    return matplotlib.image.imread(str(png))


def _colourful(pixels):
    """(saturated pixels, colours with at least 300 of them): drawn bars, not page greys."""
    import numpy as np

    rgb = pixels[..., :3].astype(float)
    if rgb.max() > 1.0:
        rgb = rgb / 255.0
    saturated = (rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.25
    bins = (rgb[saturated] * 3.999).astype(int)
    _codes, counts = np.unique(bins[:, 0] * 16 + bins[:, 1] * 4 + bins[:, 2], return_counts=True)
    return int(saturated.sum()), int((counts >= 300).sum())


@pytest.mark.slow
def test_a_real_browser_draws_the_figures(report, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip(f"no headless browser found (looked for {', '.join(BROWSERS)}); .ci/run installs Debian's chromium")
    drawn, colours = _colourful(_screenshot(browser, report, tmp_path / "report.png"))
    assert drawn > 20_000, drawn
    assert colours >= 3, colours  # compute and communication bars, memory parts, collective kinds
    control = tmp_path / "no_images.html"
    control.write_text(re.sub(r"<img [^>]*>", "", report.read_text()))
    blank, _ = _colourful(_screenshot(browser, control, tmp_path / "control.png"))
    assert blank < 500, blank


def test_a_fidelity_file_that_is_not_one_is_refused_in_one_line(tmp_path, capsys):
    plan, bad = tmp_path / "plan.json", tmp_path / "fidelity.json"
    assert main(["suggest", MLP, "--mesh", "2x4", "--out", str(plan)]) == 0
    bad.write_text('{"rows": []}')
    capsys.readouterr()
    assert main(["report", MLP, str(plan), "--out", str(tmp_path / "r.html"), "--fidelity", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'expected an object with a "plans" list' in err[0] and "fix:" in err[0]
    assert not (tmp_path / "r.html").exists()
