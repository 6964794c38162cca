"""The app in a real browser (Debian chromium driven by playwright; never `playwright install`).

One walk through the app: a streamed run whose spans and chart appear before it ends, Stop (twice), a
finished run, a two-configuration comparison, the Explain tab, then an empty prompt's visible error
while the app keeps working. Screenshots of the three tabs go to assets/screenshots/.
"""

import re
import shutil
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
SHOTS = Path(__file__).resolve().parents[2] / "assets" / "screenshots"
LONG = 120_000  # ms: a run on a busy 2-core machine


@pytest.fixture(scope="module")
def page(app_url):
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("chromium is not installed (make browser: apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(app_url)
        page.wait_for_selector("#explore-run", timeout=LONG)
        yield page
        browser.close()


def set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def status_text(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id}").inner_text()


def token_count(page) -> int:
    return page.locator("#explore-tokens .sv-tok").count()


def test_walk_through_the_app(page):
    SHOTS.mkdir(parents=True, exist_ok=True)  # the screenshots show what a newcomer gets: the defaults
    page.get_by_text(re.compile("^code: ")).first.click()
    assert page.locator("#explore-prompt textarea").input_value() != ""
    set_number(page, "explore-max-tokens", 48)

    # 1. Streaming: spans and the race chart appear while the run is still going.
    start = time.perf_counter()
    page.click("#explore-run")
    page.wait_for_selector("#explore-tokens .sv-tok", timeout=LONG)
    first_tokens_s = time.perf_counter() - start
    page.wait_for_selector("#explore-race .js-plotly-plot", timeout=LONG)
    assert "Done" not in status_text(page, "explore-status"), "the chart and spans must show before the run finishes"
    assert page.locator("#explore-status .sv-status-busy").count() == 1
    print(f"first token spans visible {first_tokens_s:.2f} s after Run (includes model loading on a cold start)")

    # 2. Stop, twice: the run stops, the partial output stays, the status says so.
    page.click("#explore-stop")
    page.click("#explore-stop")
    page.wait_for_selector("#explore-status .sv-status-stopped", timeout=30_000)
    kept = token_count(page)
    time.sleep(1.5)
    assert token_count(page) == kept > 0
    assert "Done" not in status_text(page, "explore-status")

    # 3. A finished run, raced against AR (measured after it).
    set_number(page, "explore-max-tokens", 32)
    start = time.perf_counter()
    page.click("#explore-run")
    page.wait_for_function("document.querySelector('#explore-status').innerText.includes('Decoding') && "
                           "document.querySelectorAll('#explore-tokens .sv-tok').length > 0", timeout=LONG, polling=50)
    warm_s = time.perf_counter() - start
    print(f"first token spans visible {warm_s:.2f} s after Run with models loaded")
    assert warm_s < 4.0  # the target is 1.5 s; the margin is for a busy 2-core machine
    page.wait_for_selector("#explore-status .sv-status-ok", timeout=LONG)
    assert "×" in page.locator("#explore-headline").inner_text()
    assert page.locator("#explore-dynamics .js-plotly-plot").count() == 1
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "explore.png"), full_page=True)

    # 4. A comparison of two configurations: both columns (and AR's) and the metrics table.
    page.get_by_role("tab", name="Compare").click()
    set_number(page, "compare-max-tokens", 24)
    page.click("#compare-run")
    page.wait_for_selector("#compare-status .sv-status-ok", timeout=LONG)
    assert page.locator("#compare-columns .sv-col").count() == 3
    metrics = page.locator("#compare-metrics").inner_text()
    assert "autoregressive (AR baseline)" in metrics
    labels = [h.inner_text().strip() for h in page.locator("#compare-columns .sv-col-head b").all()]
    assert len(labels) == 3 and all(label in metrics for label in labels)
    page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)

    # 5. Explain: the formula plot with the last Explore run's measured point.
    page.get_by_role("tab", name="Explain").click()
    page.wait_for_function("document.querySelector('#explain-numbers').innerText.includes('Measured (run #')", timeout=30_000)
    page.wait_for_selector("#explain-plot .js-plotly-plot", timeout=30_000)
    page.wait_for_selector("#explain-theory table", timeout=30_000)  # Lemma 3.1 per level for that run
    page.screenshot(path=str(SHOTS / "explain.png"), full_page=True)

    # 6. An empty prompt: a visible error, and the app still works afterwards.
    page.get_by_role("tab", name="Explore").click()
    page.locator("#explore-prompt textarea").fill("")
    page.click("#explore-run")
    page.wait_for_selector("#explore-status .sv-status-error", timeout=30_000)
    assert "prompt is empty" in status_text(page, "explore-status")
    page.locator("#explore-prompt textarea").fill("Say hello.")
    set_number(page, "explore-max-tokens", 6)
    page.click("#explore-run")
    page.wait_for_selector("#explore-status .sv-status-ok", timeout=LONG)
