"""The try-the-model page, end to end in headless Chromium (Debian's `chromium` driven by Playwright).

Skipped with the reason when Playwright or a Chromium binary is missing. CI installs them with
`apt-get install -y chromium` and the dev extra (playwright); no browser is downloaded.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from bertforge.serving import pipeline  # noqa: E402
from bertforge.serving.server import create_app  # noqa: E402
from bertforge.serving.server_settings import ServerSettings  # noqa: E402

from .live import LiveServer  # noqa: E402


def chromium_path() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


# Flags for a closed network and a root user (see the machine notes): no sandbox, no background traffic.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def page_url(tiny_dirs):
    tasks = ("fill-mask", "tag", "answer", "classify", "embed", "similarity", "multiple-choice")
    pipes = {task: pipeline(task, model=tiny_dirs["embed" if task == "similarity" else task]) for task in tasks}
    with LiveServer(create_app(pipes, ServerSettings(model="tiny"))) as server:
        yield server.url


@pytest.fixture(scope="module")
def browser_page(page_url, tmp_path_factory):
    executable = chromium_path()
    if executable is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(page_url)
        page.wait_for_selector("nav button[data-task]")
        yield page
        browser.close()


def _run(page, task: str, fields: dict[str, str]):
    page.click(f"nav button[data-task='{task}']")
    for name, value in fields.items():
        page.fill(f"#in-{name}", value)
    page.click("#run")
    page.wait_for_selector("#output-section:not(.hidden)")


def test_fill_mask_fills_the_blank(browser_page):
    _run(browser_page, "fill-mask", {"texts": "Paris is the [MASK] of France."})
    filled = browser_page.locator("#output .passage").inner_text()
    assert "[MASK]" not in filled and filled.startswith("Paris is the ")
    assert browser_page.locator("#output mark.fill").count() == 1
    assert browser_page.locator("#output table tr").count() == 6  # header + top 5


def test_entities_are_highlighted(browser_page):
    text = "John Smith lives in Paris, France with Mary Jones."
    _run(browser_page, "tag", {"texts": text})
    passage = browser_page.locator("#output .passage")
    # The highlighted passage still reads as the text (entity tags aside), whatever the random model tagged.
    marks = passage.locator("mark")
    visible = passage.inner_text()
    for i in range(marks.count()):
        visible = visible.replace(marks.nth(i).locator("small").inner_text(), "", 1)
    assert visible == text


def test_answer_is_marked_in_the_passage(browser_page):
    context = "John Smith works for Acme in London. He moved there in 2019."
    _run(browser_page, "answer", {"questions": "Where does John work?", "contexts": context})
    mark = browser_page.locator("#output mark.answer")
    assert mark.count() == 1
    assert mark.inner_text() == browser_page.locator("#output .answer-text").inner_text()
    assert mark.inner_text() in context
    if os.environ.get("BERTFORGE_SCREENSHOT_DIR"):  # to look at the page by eye
        browser_page.screenshot(path=str(Path(os.environ["BERTFORGE_SCREENSHOT_DIR"]) / "bertforge_page.png"))


def test_errors_are_shown(browser_page):
    browser_page.click("nav button[data-task='fill-mask']")
    browser_page.fill("#in-texts", "no mask at all")
    browser_page.click("#run")
    browser_page.wait_for_selector("#error:not(.hidden)")
    assert "[MASK]" in browser_page.locator("#error").inner_text()


def test_classify_and_embed(browser_page):
    _run(browser_page, "classify", {"texts": "a good film"})
    assert browser_page.locator("#output .label").inner_text() in ("negative", "positive")
    _run(browser_page, "embed", {"texts": "a good film\nbad\nthe story"})
    assert browser_page.locator("#output table tr").count() == 4
    _run(browser_page, "similarity", {"queries": "a film", "texts": "a good film\nbad\nthe story"})
    assert browser_page.locator("#output table tr").count() == 3  # one row per candidate, most similar first


def test_multiple_choice_shows_the_chosen_ending(browser_page):
    endings = ["and walked into the room.", "and the door sang a song.", "and it was Tuesday."]
    _run(browser_page, "multiple-choice", {"contexts": "She opened the door.", "endings": "\n".join(endings)})
    assert browser_page.locator("#output .chosen").inner_text() in endings
    rows = browser_page.locator("#output table tr")
    assert rows.count() == 3  # one row per ending, with its probability
    assert sum(float(rows.nth(i).locator("td").nth(2).inner_text().rstrip("%")) for i in range(3)) == \
        pytest.approx(100.0, abs=0.2)


def test_a_multi_label_model_shows_every_label_over_its_threshold(browser_page, page_url, tmp_path_factory):
    """A multi-label classifier (problem_type in config.json): the page lists the labels the server
    returned over the model's threshold, then every label's probability."""
    from bertforge.modeling import BertForSequenceClassification

    from .conftest import save_tiny

    labels = {0: "joy", 1: "anger", 2: "fear"}
    directory = save_tiny(tmp_path_factory.mktemp("multi_label"), BertForSequenceClassification, id2label=labels,
                          extra={"problem_type": "multi_label_classification", "multi_label_threshold": 0.0001})
    pipe = pipeline("classify", model=directory)  # a threshold this low: every label is over it
    expected = pipe(["a good film"])[0]
    assert [r["label"] for r in expected["labels"]] == sorted(labels.values(), key=lambda n: -expected["scores"][n])
    with LiveServer(create_app({"classify": pipe}, ServerSettings(model="tiny"))) as server:
        try:
            browser_page.goto(server.url)
            browser_page.wait_for_selector("nav button[data-task]")
            _run(browser_page, "classify", {"texts": "a good film"})
            shown = browser_page.locator("#output .label")
            assert [shown.nth(i).inner_text() for i in range(shown.count())] == \
                [r["label"] for r in expected["labels"]]
            assert browser_page.locator("#output table tr").count() == 3  # every label's probability
        finally:  # the other tests' page again
            browser_page.goto(page_url)
            browser_page.wait_for_selector("nav button[data-task]")
