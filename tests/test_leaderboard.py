"""`craftmd leaderboard` end to end, and the page in headless Chromium (Debian's `chromium`).

The page is driven through the Chrome DevTools protocol over ``--remote-debugging-pipe``
(fd 3: commands in, fd 4: replies out, NUL-separated JSON), so a real mouse click on a
column header can be checked to reorder the table.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from helpers import listings, run_leaderboard

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]
TEXT_MODELS = {"GPT-4", "GPT-3.5", "Mistral-v1", "Mistral-v2", "LLaMA-2-7b"}
PARTIAL = "GPT-4 <4 cases>"  # a toy partial release beside the upstream ones (its name must come out escaped)


def _partial_release(releases: Path, n: int = 4) -> list[str]:
    """A copy of GPT-4's release over ``n`` cases whose every multi-turn FRQ trial is right: it would top the board if ranked."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from craftmd.release import read_release, write_release

    r = read_release(releases / "gpt4_1106")
    v = r.verdicts(format="frq", setting="multiturn", grader="upstream-gpt4", with_image=False)
    right = v.group_by("case_id").agg(pl.col("correct").all()).filter(pl.col("correct")).sort("case_id")
    ids = pa.array(right["case_id"].head(n).to_list(), pa.string())
    tables = {t: r.table(t).filter(pc.is_in(r.table(t).column("case_id"), ids)) for t in ("answers", "conversations")}
    scores, records = r.scores_with_records()
    m = r.manifest.model_copy(
        update={"release": "toy-partial", "kind": "generated", "display_name": PARTIAL, "files": {}, "counts": {}}
    )
    write_release(releases / "toy-partial", m, tables, scores=(scores.filter(pc.is_in(scores.column("case_id"), ids)), records))
    return ids.to_pylist()


def _audit(audits: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    audits.mkdir()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(["a", "b"], [0.9, 0.8])
    fig.savefig(audits / "agreement.png", metadata={"Software": None})
    plt.close(fig)
    (audits / "constructed.json").write_text(
        json.dumps(
            {
                "id": "constructed",
                "title": "Grader agreement (constructed for the test)",
                "description": "How often two graders agree.\n\nSecond paragraph with <b>markup</b> that must be escaped.",
                "tables": [
                    {
                        "name": "Cohen's kappa",
                        "columns": ["pair", "kappa", "n"],
                        "rows": [["offline vs upstream-gpt4", 0.71234, 40080]],
                    }
                ],
                "figures": ["agreement.png"],
            }
        )
    )


def _leaderboard(source, dataset_dir, root: Path, out: Path) -> subprocess.CompletedProcess:
    """`craftmd leaderboard` over ``root/releases`` with the audits of ``root/audits``."""
    return run_leaderboard(source, dataset_dir, root / "releases", out, "--audits", root / "audits")


@pytest.fixture(scope="module")
def board(source, dataset_dir, releases_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("leaderboard")
    releases = root / "releases"
    shutil.copytree(releases_dir, releases)  # grading rewrites releases; keep the session's intact
    _partial_release(releases)
    _audit(root / "audits")
    out = root / "site"
    proc = _leaderboard(source, dataset_dir, root, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_the_command_writes_the_page_tables_and_figures(board):
    out, proc = board
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith(str((out / "index.html").resolve()))
    for f in (
        "index.html",
        "leaderboard.md",
        "tables/accuracy.csv",
        "tables/pvalues.csv",
        "figures/settings.png",
        "figures/specialty_heatmap.png",
        "figures/mcq_frq_drop.png",
        "figures/mcq_rules.png",
    ):
        assert (out / f).is_file() and (out / f).stat().st_size > 500, f
    acc = pl.read_csv(out / "tables" / "accuracy.csv")
    assert {"upstream-gpt4", "paper", "strict"} <= set(acc["grader"].unique())
    assert "[leaderboard] analyse" in proc.stderr  # progress is shown


def test_the_page_is_self_contained_and_names_its_graders(board):
    out, _ = board
    page = (out / "index.html").read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?:https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    for img in re.findall(r'<img src="([^"]+)"', page):
        assert (out / img).is_file(), img
    assert "Conversational free-response accuracy" in page[: page.index('id="board"')]  # the page leads with it
    assert "<code>upstream-gpt4</code>" in page
    assert "paper</code> and <code>strict" in page
    # the audit is rendered, escaped, with its table and figure
    assert "Grader agreement (constructed for the test)" in page
    assert "&lt;b&gt;markup&lt;/b&gt;" in page and "0.712" in page
    assert (out / "figures" / "audits" / "constructed" / "agreement.png").is_file()
    # the audits the package computes itself are there too
    assert "FRQ grader agreement" in page and "Expert validation" in page
    agreement = json.loads((out / "audits" / "grader_agreement.json").read_text())
    # every FRQ grader's measured agreement with the GPT-4 grader-AI and with the dermatologists, next to the scores
    table = page[page.index('id="grader-reliability"') :]
    table = table[: table.index("</table>")]
    derm = agreement["data"]["dermatologists"]
    assert set(derm) == {"upstream-gpt4", "offline"} and derm["upstream-gpt4"]["agreement_pct"] == 93.35
    for grader, d in derm.items():
        assert f"<code>{grader}</code>" in table and f"{d['agreement_pct']} % ({d['cases']} cases" in table
    assert f"kappa {agreement['data']['overall']['held-out']['kappa']:.3f}" in table


# -- the browser -------------------------------------------------------------------------------


def _above_4(fd: int) -> int:
    """``fd`` moved to a number above 4 (closed on exec)."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(fd)
    return high


class DevTools:
    """A minimal Chrome DevTools protocol client over --remote-debugging-pipe."""

    def __init__(self, user_data: Path):
        # the child's ends become its fds 3 and 4: every end is kept above them first (a process with few files
        # open gets 3 and 4 from os.pipe, which the child's dup2 would overwrite)
        cmd_r, self._cmd_w, self._out_r, out_w = (_above_4(fd) for fd in (*os.pipe(), *os.pipe()))

        def child_fds():
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                *CHROME_FLAGS,
                "--remote-debugging-pipe",
                f"--user-data-dir={user_data}",
                "--window-size=1280,1000",
                "about:blank",
            ],
            preexec_fn=child_fds,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.session = None

    def call(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError(method)
            chunk = os.read(self._out_r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium exited")
            self._buf += chunk

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for _ in range(100):
            if self.js("location.href") == url and self.js("document.readyState") == "complete":
                return
            time.sleep(0.1)
        raise TimeoutError("page load")

    def js(self, expr: str):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        return r["result"].get("value")

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._cmd_w)
        os.close(self._out_r)


@pytest.fixture
def browser(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed (make browser, or apt-get install -y chromium)")
    b = DevTools(tmp_path / "profile")
    yield b
    b.close()


ROWS = "Array.from(document.querySelectorAll('#leaderboard tbody tr')).map(r => r.cells[1].textContent)"


def _column_values(b: DevTools, header: str) -> list[float]:
    return b.js(
        "(() => { const hs = Array.from(document.querySelectorAll('#leaderboard thead th'));"
        f" const i = hs.findIndex(h => h.textContent.trim() === {json.dumps(header)});"
        " return Array.from(document.querySelectorAll('#leaderboard tbody tr')).map(r => parseFloat(r.cells[i].dataset.v)); })()"
    )


def _header_center(b: DevTools, header: str) -> tuple[float, float]:
    rect = b.js(
        "(() => { const h = Array.from(document.querySelectorAll('#leaderboard thead th'))"
        f".find(h => h.textContent.trim() === {json.dumps(header)}); h.scrollIntoView({{block: 'center', inline: 'center'}});"
        " const r = h.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )
    return rect[0], rect[1]


def test_the_page_renders_every_model_and_sorts_on_click(board, browser):
    out, _ = board
    browser.open((out / "index.html").resolve().as_uri())
    rows = browser.js(ROWS)
    assert set(rows) == TEXT_MODELS  # every text model, once
    assert len(rows) == len(TEXT_MODELS)
    lead = _column_values(browser, "Multi-turn FRQ")
    assert lead == sorted(lead, reverse=True)  # ranked by the leading measure
    # a real click on a column header sorts by it (descending first, then ascending)
    browser.click(*_header_center(browser, "Vignette MCQ"))
    vals = _column_values(browser, "Vignette MCQ")
    assert vals == sorted(vals, reverse=True)
    after = browser.js(ROWS)
    assert after != rows and after[0] == "GPT-4"
    browser.click(*_header_center(browser, "Vignette MCQ"))
    assert _column_values(browser, "Vignette MCQ") == sorted(vals)
    # the specialty view switches tables
    visible = browser.js("Array.from(document.querySelectorAll('.spec-table')).filter(d => d.style.display !== 'none').length")
    assert visible == 1
    assert browser.js("document.querySelectorAll('.spec-table:not([style*=none]) tbody tr').length") == 12


def test_screenshot(board, tmp_path):
    out, _ = board
    shot = out / "screenshot.png"
    subprocess.run(
        [
            CHROMIUM,
            *CHROME_FLAGS,
            f"--user-data-dir={tmp_path / 'p'}",
            "--window-size=1280,2600",
            f"--screenshot={shot}",
            (out / "index.html").resolve().as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 50_000  # a rendered page, not a blank one


def test_a_partial_run_is_listed_apart_and_never_leads(board, dataset_dir):
    """A release over 4 cases (all right) next to the upstream ones: not ranked, not the best model, its coverage shown."""
    out, _ = board
    page = (out / "index.html").read_text()
    n_cases = pl.read_parquet(dataset_dir / "all" / "test-00000-of-00001.parquet").height
    lead = page[page.index('class="lead"') : page.index('id="board"')]
    gpt4 = (
        pl.read_csv(out / "tables" / "accuracy.csv")
        .filter(
            pl.col("model") == "gpt4_1106",
            pl.col("setting") == "multiturn",
            pl.col("format") == "frq",
            pl.col("grader") == "upstream-gpt4",
            pl.col("group_by") == "all",
            ~pl.col("with_image"),
        )
        .row(0, named=True)
    )
    assert "<b>GPT-4</b>" in lead and f"<b>{gpt4['accuracy']:.1%}</b>" in lead and "4 cases" not in lead
    escaped = "GPT-4 &lt;4 cases&gt;"
    assert PARTIAL not in page  # escaped everywhere
    partial = page[page.index('id="partial-runs"') :]
    partial = partial[: partial.index("</table>")]
    assert escaped in partial and f"4 of {n_cases:,} cases" in partial
    assert 'class="leadcol" data-v="1.000000">1.000' in partial  # its own figures, shown apart
    # nor in the ranking, the specialty and dataset tables, the MCQ rules, the graders' table or the tests
    for start, end in (('id="leaderboard"', 'id="partial"'), ('id="specialty"', 'id="trust"')):
        assert escaped not in page[page.index(start) : page.index(end)], start
    md = (out / "leaderboard.md").read_text()
    assert f"| {escaped} | generated | 4 of {n_cases:,} cases |" in md and PARTIAL not in md  # escaped in the markdown too
    assert md.index(f"| {escaped} |") > md.index("## Partial runs")


def test_cases_per_specialty_are_the_datasets(board, dataset_dir):
    """Issue #13: with a 4-case release present, every specialty row still counts the dataset's cases (Dermatology: 317)."""
    out, _ = board
    page = (out / "index.html").read_text()
    truth = dict(pl.read_parquet(dataset_dir / "all" / "test-00000-of-00001.parquet").group_by("specialty").len().iter_rows())
    assert truth["Dermatology"] == 317
    for table in re.findall(r'<div class="spec-table".*?</table>', page, re.S):
        shown = dict(re.findall(r'<tr><td class="txt">([^<]+)</td><td data-v="(\d+)"', table))
        assert {k: int(v) for k, v in shown.items()} == truth


def test_the_same_inputs_give_a_byte_identical_page(board, source, dataset_dir):
    """A second run over the same releases writes the same page, markdown, tables and figures, byte for byte."""
    out, _ = board
    again = out.parent / "again"
    proc = _leaderboard(source, dataset_dir, out.parent, again)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for f in (
        "index.html",
        "leaderboard.md",
        "tables/accuracy.csv",
        "tables/pvalues.csv",
        "tables/group_sizes.csv",
        "figures/settings.png",
        "figures/specialty_heatmap.png",
    ):
        assert (again / f).read_bytes() == (out / f).read_bytes(), f
    # into the same folder again: what again/.cache kept is read back, and every file is the same, byte for byte
    first = {p.relative_to(again): p.read_bytes() for p in sorted(again.rglob("*")) if p.is_file()}
    assert Path(".cache/resamples.parquet") in first and Path("figures/settings.png") in first
    proc = _leaderboard(source, dataset_dir, out.parent, again)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.relative_to(again): p.read_bytes() for p in sorted(again.rglob("*")) if p.is_file()} == first


def test_a_dataset_built_by_other_builder_code_is_not_taken_for_current(source, dataset_dir, tmp_path):
    """`make leaderboard` over an `out/data` left by an older checkout rebuilds it instead of failing later."""
    from craftmd.commands.leaderboard import _dataset_current

    data = tmp_path / "data"
    shutil.copytree(dataset_dir, data)
    assert _dataset_current(data, source)
    mf = data / "build_manifest.json"
    manifest = json.loads(mf.read_text())
    manifest["builder"]["code_sha256"] = "0" * 64
    mf.write_text(json.dumps(manifest))
    assert not _dataset_current(data, source)
    del manifest["builder"]["code_sha256"]  # built before the builder recorded its code
    mf.write_text(json.dumps(manifest))
    assert not _dataset_current(data, source)


def test_a_leaderboard_with_every_score_current_reads_each_release_and_the_dataset_once(board, source, dataset_dir, monkeypatch):
    """With every score current, `craftmd leaderboard` (scoring's staleness checks, the analysis, the audits, the page)
    lists the releases folder once (its board, analysis.board.Board.read), reads each release's answers.parquet from disk
    once, and hashes each dataset file at most once."""
    import collections
    import weakref

    import craftmd.atomic
    import craftmd.dataset
    import craftmd.release
    from craftmd.commands.cli import main

    out, _ = board
    releases = out.parent / "releases"
    reads, hashes = collections.Counter(), collections.Counter()
    read_file, sha256_file = craftmd.release.read_file, craftmd.atomic.sha256_file

    def counted_read(path, *args, **kwargs):  # read_file's bound on the size, as the caller gives it
        reads[str(path)] += 1
        return read_file(path, *args, **kwargs)

    def counted_hash(path):
        hashes[str(path)] += 1
        return sha256_file(path)

    monkeypatch.setattr(craftmd.release, "read_file", counted_read)
    monkeypatch.setattr(craftmd.atomic, "sha256_file", counted_hash)
    monkeypatch.setattr(craftmd.release, "_OPEN", weakref.WeakValueDictionary())  # nothing this process opened before
    monkeypatch.setattr(craftmd.dataset, "_HASHED", {})
    monkeypatch.setenv("CRAFTMD_SOURCE", str(source.path))
    listed = listings(monkeypatch, releases)
    assert (
        main(
            [
                "leaderboard",
                "--dataset",
                str(dataset_dir),
                "--releases",
                str(releases),
                "--out",
                str(out.parent / "once"),
                "--audits",
                str(out.parent / "audits"),
                "--quiet",
            ]
        )
        == 0
    )
    assert listed == ["find_releases"], listed  # ingest opens its own releases by name; nothing else lists the folder
    answers = sorted(str(p / "answers.parquet") for p in releases.iterdir() if (p / "answers.parquet").exists())
    assert len(answers) >= 6
    assert {a: reads[a] for a in answers} == dict.fromkeys(answers, 1)
    assert all(n == 1 for n in reads.values()), reads.most_common(3)
    dataset_hashes = {p: n for p, n in hashes.items() if p.startswith(str(dataset_dir))}
    assert dataset_hashes and max(dataset_hashes.values()) == 1, collections.Counter(dataset_hashes).most_common(3)


def test_every_table_is_documented_with_its_columns(board):
    """The analysis page of the documentation lists every table the board writes, with exactly its columns."""
    from helpers import assert_tables_documented

    out, _ = board
    assert_tables_documented(out / "tables")
