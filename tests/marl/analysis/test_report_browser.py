"""The HTML report in a real headless browser (Debian's Chromium, driven by Playwright):
it renders, every figure loads, and the console stays clean."""

import os
import shutil

import pytest
from typer.testing import CliRunner

from marl.cli import app
from tests.marl.conftest import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

if not os.path.exists(CHROMIUM) and not os.environ.get("CI"):
    pytest.skip("no Chromium here (CI installs it: apt-get install chromium)",
                allow_module_level=True)


def test_the_report_renders_in_chromium_with_every_figure_and_no_console_error(tmp_path):
    from playwright.sync_api import sync_playwright

    runner = CliRunner()
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", str(ROOT / "scenarios" / "signal.yaml"), "--out",
                              str(run), "--set", "iterations=2", "--set", "episodes_per_iter=2",
                              "--set", "group_size=2", "--set", "eval_episodes=4",
                              "--set", "eval_every=1", "--set", "warmup_steps=1",
                              "--set", "warmup_episodes=2"])
    assert res.exit_code == 0, res.output
    report = tmp_path / "report.html"
    res = runner.invoke(app, ["analyze", str(run), "--out", str(report)])
    assert res.exit_code == 0, res.output
    errors, failed = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.goto(report.as_uri(), wait_until="load")
        images = page.eval_on_selector_all(
            "img", "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])")
        title = page.title()
        heading = page.inner_text("h1")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert title == "marl analyze" and "1 run" in heading
    assert len(images) >= 3  # learning, cost, per agent, tokens, emergence
    assert all(done and w > 100 and h > 100 for done, w, h in images), images
    assert errors == [] and failed == []
