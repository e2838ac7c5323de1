"""The leaderboard page at a large board (issue #46): every board sortable and searchable in the browser, its first
``page.TOP_ROWS`` rows shown until a reader asks, the lists of pairs and of each model's settings cut to the top
releases with the rest in ``tables/``, the page's size bounded, names inert, the same data giving the same bytes; and a
small board's page hiding nothing.

The large board is made by ``bench/bench_page.py``'s :func:`replicate` from an analysis of three constructed releases
(copies under new ids, each round of copies a little lower), so the page alone is measured, never a long analysis. The
pages are opened in headless Chromium (``make browser``), driven as tests/test_leaderboard.py drives it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import polars as pl
import pytest

from test_analysis import _all_trials, _dataset, _release
from test_leaderboard import browser  # noqa: F401 (the headless Chromium fixture)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bench_page import RELEASE_COLUMNS, replicate  # noqa: E402

from craftmd.analysis.page import TOP_ROWS, write_page  # noqa: E402

N = 300
HOSTILE = "</script><script>window.pwned = 1</script>"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """An analysis of three constructed releases (40 cases, 5 trials; vignette, multi-turn, single-turn)."""
    from craftmd.analysis.tables import compute

    root = tmp_path_factory.mktemp("page-scale")
    data = _dataset(root)
    rel = root / "releases"
    _release(
        rel, "a", {"vignette": _all_trials(range(30)), "multiturn": _all_trials(range(12)), "singleturn": _all_trials(range(8))}
    )
    _release(
        rel, "b", {"vignette": _all_trials(range(25)), "multiturn": _all_trials(range(10)), "singleturn": _all_trials(range(9))}
    )
    _release(
        rel, "c", {"vignette": _all_trials(range(20)), "multiturn": _all_trials(range(6)), "singleturn": _all_trials(range(4))}
    )
    return compute(rel, data, B=200)


def _rename(a, old: str, new: str, display: str):
    """``a`` with release ``old`` renamed ``new`` in every table and displayed as ``display``."""
    import dataclasses

    frames = {}
    for name, cols in RELEASE_COLUMNS.items():
        df = getattr(a, name, None)
        if df is not None:
            frames[name] = df.with_columns([pl.col(c).replace(old, new) for c in cols if c in df.columns])
    frames["releases"] = frames["releases"].with_columns(
        pl.when(pl.col("release") == new).then(pl.lit(display)).otherwise(pl.col("display")).alias("display")
    )
    out = dataclasses.replace(a, **frames)
    out.__dict__.pop("_view", None)
    return out


@pytest.fixture(scope="module")
def large(small, tmp_path_factory):
    """The page of a board of N copies, one of them (ranked far below the top) named and displayed as a script."""
    from craftmd.analysis.view import View

    big = replicate(small, N)
    v = View.of(big)
    assert len(v.models) == N and v.models[:TOP_ROWS] != v.models[-TOP_ROWS:]
    low = v.models[250]
    big = _rename(big, low, HOSTILE, HOSTILE)
    out = tmp_path_factory.mktemp("page-large")
    page = write_page(big, out)
    return big, page


def _uri(page: Path) -> str:
    return page.resolve().as_uri()


VISIBLE = (
    "(sel) => Array.from(document.querySelectorAll(sel + ' tbody tr')).filter(r => !r.hidden).map(r => r.cells[1].textContent)"
)


def _visible(b, table: str) -> list[str]:
    return b.js(f"({VISIBLE})({json.dumps(table)})")


def _type(b, table: str, text: str) -> None:
    """Focus ``table``'s search box and type ``text`` into it, as a reader does."""
    b.js(f"document.querySelector({json.dumps(table)}).closest('.scroll').previousElementSibling.querySelector('input').focus()")
    b.call("Input.insertText", {"text": text})


def test_a_large_page_stays_small_and_lists_only_the_top_of_its_pairs(large):
    big, page = large
    html = page.read_text()
    assert page.stat().st_size < 5_000_000 * N / 1000  # the budget of 5 MB at 1,000 releases, in proportion
    # the board holds every ranked release, only the first TOP_ROWS shown before a reader asks
    board = html[html.index('<table id="leaderboard"') :]
    board = board[: board.index("</tbody>")]
    rows = re.findall(r"<tr(?: hidden)?>", board.split("<tbody>", 1)[1])
    assert len(rows) == N and rows.count("<tr>") == TOP_ROWS
    # the headline contrasts: only the board's first TOP_ROWS models, the rest pointed to in tables/pvalues.csv
    tests = html[html.index('<table id="tests-table"') :]
    tests = tests[: tests.index("</table>")]
    assert 0 < tests.count("<tr>") - 1 <= 2 * TOP_ROWS  # the header row, then at most one row per model and format
    assert f'{TOP_ROWS} of {N}; every one is in <a href="tables/pvalues.csv">' in html
    # the specialty tables: a column for each of the board's first TOP_ROWS models
    spec = html[html.index('<div class="spec-table"') :]
    assert spec[: spec.index("</tr>")].count("<th>") == TOP_ROWS + 1  # Cases, then the models
    # the release list: the releases at the top, the rest in tables/protocols.csv
    listed = html[html.index("<h3>Releases</h3>") :]
    listed, rest = listed.split("</ul>", 1)
    assert listed.count("<li>") == TOP_ROWS and 'href="tables/protocols.csv"' in rest.split("</p>", 1)[0]


def test_only_the_top_rows_show_until_a_reader_searches_or_asks_for_all(large, browser):  # noqa: F811
    big, page = large
    from craftmd.analysis.view import View

    v = View.of(big)
    browser.open(_uri(page))
    # every board of more than TOP_ROWS rows shows its first TOP_ROWS
    shown = browser.js(
        "Array.from(document.querySelectorAll('table.board[data-top]')).map(t => [t.id, t.tBodies[t.tBodies.length - 1]"
        ".rows.length, Array.from(t.querySelectorAll('tbody tr')).filter(r => !r.hidden && r.offsetParent !== null).length])"
    )
    assert shown and all(vis == min(n, TOP_ROWS) for _, n, vis in shown), shown
    first = [v.display(m) for m in v.models[:TOP_ROWS]]
    assert _visible(browser, "#leaderboard") == first
    # a model far below the top is found by a search
    target = v.display(v.models[200])
    assert target not in first
    _type(browser, "#leaderboard", target)
    assert _visible(browser, "#leaderboard") == [target]
    browser.js("(() => { const i = document.querySelector('#leaderboard').closest('.scroll').previousElementSibling"
               ".querySelector('input'); i.value = ''; i.dispatchEvent(new Event('input')); })()")  # fmt: skip
    assert _visible(browser, "#leaderboard") == first
    # "Show all" shows every row; again, the first TOP_ROWS
    more = "document.querySelector('#leaderboard').closest('.scroll').previousElementSibling.querySelector('button')"
    browser.js(f"{more}.click()")
    assert len(_visible(browser, "#leaderboard")) == N
    browser.js(f"{more}.click()")
    assert _visible(browser, "#leaderboard") == first


def test_sorting_a_column_reorders_the_rows_and_shows_the_top_of_the_new_order(large, browser):  # noqa: F811
    big, page = large
    from craftmd.analysis.view import View

    v = View.of(big)
    browser.open(_uri(page))
    rank = "Array.from(document.querySelectorAll('#leaderboard tbody tr')).filter(r => !r.hidden).map(r => +r.cells[0].dataset.v)"
    assert browser.js(rank) == list(range(1, TOP_ROWS + 1))
    rect = browser.js(
        "(() => { const h = document.querySelector('#leaderboard thead th'); h.scrollIntoView({block: 'center'});"
        " const r = h.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )
    browser.click(*rect)  # descending by rank: the last of the board first
    assert browser.js(rank) == list(range(N, N - TOP_ROWS, -1))
    assert _visible(browser, "#leaderboard")[0] == v.display(v.models[-1])


def test_a_name_that_is_a_script_stays_text(large, browser):  # noqa: F811
    big, page = large
    html = page.read_text()
    assert html.count("<script") == 1 and "window.pwned" in html  # its name is in the page, escaped
    assert "&lt;/script&gt;&lt;script&gt;window.pwned = 1&lt;/script&gt;" in html
    browser.open(_uri(page))
    assert browser.js("document.scripts.length") == 1 and browser.js("typeof window.pwned") == "undefined"
    _type(browser, "#leaderboard", "pwned")
    assert _visible(browser, "#leaderboard") == [HOSTILE]  # shown as its own text, found by a search


def test_the_same_data_gives_the_same_page(small, tmp_path):
    big = replicate(small, N)
    one = write_page(big, tmp_path / "one").read_bytes()
    two = write_page(replicate(small, N), tmp_path / "two").read_bytes()
    assert one == two


def test_a_small_board_hides_nothing(small, tmp_path, browser):  # noqa: F811
    six = replicate(small, 6)
    page = write_page(six, tmp_path / "six")
    html = page.read_text()
    assert " hidden>" not in html and 'class="note cut"' not in html and "each table shows its first" not in html
    browser.open(_uri(page))
    assert browser.js("Array.from(document.querySelectorAll('tbody tr')).filter(r => r.hidden).length") == 0
    assert len(_visible(browser, "#leaderboard")) == 6
    # every board has its search box, and "Show all" only where rows are hidden (none here)
    boards = browser.js("document.querySelectorAll('table.board').length")
    assert boards > 1 and browser.js("document.querySelectorAll('.filter input').length") == boards
    assert browser.js("Array.from(document.querySelectorAll('.filter button')).filter(b => !b.hidden).length") == 0
