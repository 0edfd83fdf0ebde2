"""Breaking the chain in a real browser: reached from the sidebar, two Steps show a round with
its verified positions, Run goes to the end with both lanes identical; in presentation mode at
1280x720 a presenter remote's keys step and run it, and each round fits one screen. Screenshots
go to test-artifacts/ for a person to look at."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.browser.conftest import ARTIFACTS, app_tab
from tests.browser.runs import SLOW, TWO_FRAMES, settle
from tests.browser.test_presentation import outside_viewport, presentation_on
from tests.browser.test_teaching_pages import open_page, shoot

pytestmark = pytest.mark.browser


def test_steps_then_run_show_rounds_beside_plain_decoding(page):
    open_page(page, "Breaking the chain")
    page.get_by_role("button", name="Step").wait_for(timeout=SLOW)
    settle(page)
    for _ in range(5):  # the copying preset: the first rounds read the prompt, then guesses start
        page.get_by_role("button", name="Step", exact=True).click()
        settle(page)
    page.get_by_role("heading", name=re.compile(r"Round 5:")).wait_for(timeout=SLOW)
    assert page.locator(".bc-pos").count() >= 1
    assert page.locator(".bc-pos th", has_text="raw p").count() >= 1  # greedy: the model's softmax, not 100 %
    shoot(page, "breaking_the_chain_round", height=1800)
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text(re.compile("finished: eos")).wait_for(timeout=SLOW)
    settle(page)
    assert page.get_by_text(re.compile("Identical text, token for token")).is_visible()
    passes = page.locator("[data-testid='stMetricValue']").all_inner_texts()
    tokens, speculative, plain = (int(v) for v in passes[:3])
    assert speculative < plain == tokens
    shoot(page, "breaking_the_chain_finished", height=2600)


def test_the_race_says_its_cost_runs_in_the_background_with_a_live_row_and_names_the_winner(browser, app_url):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        page.goto(f"{app_url}/breaking_the_chain")
        race = page.get_by_role("button", name="Race", exact=True)
        race.wait_for(timeout=SLOW)
        settle(page)
        race.scroll_into_view_if_needed()
        assert page.get_by_text(re.compile(r"^8 runs of 48 new tokens, one after another")).count() == 1  # cost first
        race.click()
        running = page.get_by_text(re.compile(r"of 8 runs done · running (lookahead|parallel|multi-token|early exit)"))
        running.first.wait_for(timeout=SLOW)  # the progress names the method under way
        assert page.locator("[data-testid='stDataFrame']").count() >= 1  # its rows so far, live
        verdict = page.get_by_text(re.compile("was fastest here|No method beat plain decoding"))
        verdict.wait_for(timeout=600_000)
        settle(page)
        header = page.locator("[data-testid='stDataFrame']").last
        header.scroll_into_view_if_needed()
        same = page.get_by_role("columnheader", name="same text")
        if same.count():  # the grid's header cells, where the browser exposes them
            box = same.first.bounding_box()
            assert box["x"] + box["width"] <= 1280, "the 'same text' column is off-screen at 1,280 px"
        page.get_by_text("The texts").click()
        page.get_by_text("Every method wrote exactly this:").wait_for(timeout=SLOW)
        assert page.get_by_text(re.compile(r"about \d+ s, what the last race here took")).count() == 1  # the next cost
        shoot(page, "breaking_the_chain_race", height=2000)
    finally:
        context.close()


# what in an accept / reject card reaches past its border, or a number wider than its cell
CARD_OVERFLOW = """() => [...document.querySelectorAll('.bc-pos')].flatMap(card => {
  const edge = card.getBoundingClientRect().right + 0.5;
  return [...card.querySelectorAll('h4, div, table, th, td')]
    .filter(e => e.getBoundingClientRect().right > edge || (e.matches('.num') && e.scrollWidth > e.clientWidth))
    .map(e => `${card.dataset.position}: ${e.textContent.trim()}`);
})"""


@contextmanager
def chain_page(browser, app_url: str, **options) -> Iterator:
    """A tab of its own (`options` for its context: viewport, colour scheme) on Breaking the
    chain, its Step button drawn and the run over."""
    page = app_tab(browser, app_url, **options)
    try:
        open_page(page, "Breaking the chain")
        page.get_by_role("button", name="Step").wait_for(timeout=SLOW)
        settle(page)
        yield page
    finally:
        page.context.close()


def choose_preset(page, name: str) -> None:
    box = page.locator(".st-key-bc_preset input[role=combobox]")
    box.click()
    box.fill(name)
    page.get_by_role("option", name=re.compile(name)).click()
    settle(page)
    page.get_by_role("button", name="Reset", exact=True).click()
    settle(page)


CARD_WIDTHS = (1440, 1024)


def test_the_accept_reject_cards_hold_their_numbers_at_1440_and_1024_px(browser, app_url):
    """Sampled copying, round by round until a guess is rejected (the residual column shows):
    no card's text runs past its border, no number past its cell, at either width (the same
    rounds, the window resized after each)."""
    with chain_page(browser, app_url, viewport={"width": CARD_WIDTHS[0], "height": 900}) as page:
        choose_preset(page, "Sampled copying")
        page.get_by_role("button", name="Sampler and stop").click()  # seed 0 rejects a guess within the budget
        seed = page.locator(".st-key-bc_seed input")
        seed.fill("0")
        seed.press("Enter")
        settle(page)
        page.keyboard.press("Escape")  # close the popover
        settle(page)
        page.get_by_role("button", name="Step", exact=True).click()  # round 1 reads the prompt: no guess
        # a busy server may start the round's rerun later than settle's first look: wait for the round itself
        page.wait_for_function(f"{ROUNDS} === 1", timeout=SLOW)
        settle(page)
        assert page.get_by_role("heading", name=re.compile("Round 1: no guess, a plain decode step")).count() == 1
        assert page.get_by_text(re.compile(r"returned 1 distribution, the one after the context")).count() == 1
        for round_number in range(2, 17):
            page.get_by_role("button", name="Step", exact=True).click()
            page.wait_for_function(f"{ROUNDS} === {round_number}", timeout=SLOW)
            settle(page)
            for width in CARD_WIDTHS:
                page.set_viewport_size({"width": width, "height": 900})
                page.evaluate(TWO_FRAMES)  # laid out again at this width
                assert page.evaluate(CARD_OVERFLOW) == [], (round_number, width)
            if page.locator(".bc-pos th", has_text="residual").count():
                break
        assert page.locator(".bc-pos th", has_text="residual").count() == 1
        for width in CARD_WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            page.locator(".bc-guesses").scroll_into_view_if_needed()
            page.evaluate(TWO_FRAMES)
            page.screenshot(path=str(ARTIFACTS / f"breaking_the_chain_cards_{width}.png"))


ROUNDS = "Number(document.querySelector('[data-rounds]')?.dataset.rounds ?? -1)"
ON_ROUND_SCREEN = {
    "buttons": ".st-key-bc_step",
    "speculative lane's chips": ":nth-match(.tbt-chip-window, 1)",
    "plain lane's chips": ":nth-match(.tbt-chip-window, 2)",
    "the plain lane's newest chip": ".tbt-newest",
    "the round's guesses, marked": ".bc-line",
    "a mark": ".bc-line .bc-mark",
    "tokens produced": ":nth-match([data-testid='stMetric'], 1)",
    "passes, speculative": ":nth-match([data-testid='stMetric'], 2)",
    "passes, plain": ":nth-match([data-testid='stMetric'], 3)",
}


def test_presentation_mode_fits_a_round_on_a_720p_screen_and_steps_from_the_keys(browser, app_url):
    width, height = 1280, 720
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        page.goto(app_url)
        open_page(page, "Breaking the chain")
        page.get_by_role("button", name="Step").wait_for(timeout=SLOW)
        settle(page)
        presentation_on(page)
        assert page.get_by_role("heading", name="Breaking the chain").count() == 0
        hint = page.evaluate("getComputedStyle(document.querySelector('.st-key-bc_step button'), '::after').content")
        assert "PgDn" in hint
        page.evaluate("document.activeElement.blur()")  # the toggle just clicked would keep the arrows
        page.mouse.move(width - 5, height - 5)
        for count in range(1, 7):  # a presenter remote's "next"
            page.keyboard.press("PageDown" if count % 2 else "ArrowRight")
            page.wait_for_function(f"{ROUNDS} === {count}", timeout=SLOW)
            settle(page)
        assert page.locator(".bc-line").first.get_attribute("data-round") == "6"
        assert outside_viewport(page, ON_ROUND_SCREEN, width, height) == []
        assert page.locator(".bc-line .bc-ok").count() >= 1  # the copying preset: guesses kept by round 6
        page.screenshot(path=str(ARTIFACTS / f"presentation_chain_{width}x{height}.png"))

        page.keyboard.press(".")  # the remote's blank-screen button: Run, to the end
        page.get_by_text(re.compile("finished: eos")).wait_for(timeout=SLOW)
        settle(page)
        assert outside_viewport(page, ON_ROUND_SCREEN, width, height) == []
        page.screenshot(path=str(ARTIFACTS / f"presentation_chain_finished_{width}x{height}.png"))
    finally:
        context.close()


def choose_method(page, label: str) -> None:
    box = page.locator(".st-key-bc_method input[role=combobox]")
    box.click()
    box.fill(label[:20])
    page.get_by_role("option", name=label).click()
    settle(page)


PICTURED = [("parallel decoding heads (Medusa-style, trained here)", "medusa-heads"),
            ("multi-token prediction module (trained here)", "mtp"),
            ("lookahead decoding (Jacobi window + n-gram pool)", "lookahead"),
            ("early exit: the model's own first layers draft", "early-exit-")]


def test_each_methods_round_has_its_own_picture_in_either_theme(browser, app_url):
    """Heads fan out from one state, MTP chains its guesses, lookahead shows its window and pool,
    early exit its layers: each drawn under the round it made, its guesses marked as judged, and
    nothing in it wider than the page. A picture takes the page's own colours, so each is shot in
    light and again with the system switched to dark."""
    with chain_page(browser, app_url, viewport={"width": 1280, "height": 900}, color_scheme="light") as page:
        for label, method in PICTURED:
            choose_method(page, label)
            figure = page.locator(f"figure.dp[data-method^='{method}']")
            for _ in range(4):  # the first round reads the prompt; a trained draft then needs one observed state
                page.get_by_role("button", name="Step", exact=True).click()
                settle(page)
                if figure.count():
                    break
            figure.wait_for(timeout=SLOW)
            guesses = int(figure.get_attribute("data-guesses"))
            assert guesses >= 1
            assert figure.locator(".bc-mark").count() == guesses  # every guess marked ✓, ✗ or –
            caption = figure.locator("figcaption").inner_text()
            assert caption and figure.bounding_box()["width"] <= 1280
            if method == "lookahead":
                assert figure.get_by_text("n-gram pool after").is_visible()
            elif method.startswith("early-exit"):
                assert figure.locator(".dp-layer.dp-ran").count() >= 1
            else:
                assert figure.locator(".dp-leaders").count() == guesses  # the draft's leading tokens per guess
            figure.scroll_into_view_if_needed()
            for scheme in ("light", "dark"):  # the page's colours follow the system at once, no run between
                page.emulate_media(color_scheme=scheme)
                page.evaluate(TWO_FRAMES)
                assert page.get_by_test_id("stApp").evaluate("e => getComputedStyle(e).colorScheme") == scheme
                figure.screenshot(path=str(ARTIFACTS / f"draft_picture_{method.rstrip('-')}_{scheme}.png"))
            page.emulate_media(color_scheme="light")
