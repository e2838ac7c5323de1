"""The documentation a user finds: a short README that points into the site, a site that builds with warnings as
errors, every page reachable from its index with no broken link, anchor or image, the command reference and the
task pages generated from the code, and the claims a test can check checked (issue #47).

The site is built once here into a temporary folder with the command ``make docs`` runs (``sphinx -W``), so a plain
``pytest`` checks it as CI does.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_imports import ROOMS, _imports, _module, stated_room_imports  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 150


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built as ``make docs`` builds it: warnings (a broken reference, a missing page or anchor, a page in
    no table of contents, a docstring reST cannot parse) are errors."""
    out = tmp_path_factory.mktemp("site") / "html"
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, f"the documentation does not build cleanly:\n{run.stderr[-4000:]}"
    return out


class _Links(HTMLParser):
    """The hrefs, image sources and element ids of one HTML page."""

    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []
        self.images: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])


def _parse(page: Path) -> _Links:
    p = _Links()
    p.feed(page.read_text(encoding="utf-8"))
    return p


def _internal(href: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", href)  # no scheme: a page of the site (or an anchor on this one)


def test_readme_is_short_and_points_into_the_site():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for section in ("## Set-up (two commands on a fresh machine)", "## What it reproduces", "## Licence and citation"):
        assert section in readme
    assert "make leaderboard" in readme and "make test" in readme
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [target for target in links if _internal(target)]
    assert len(local) >= 15, local  # a link into the site per user path
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_page_reachable_no_broken_link_anchor_or_image(site):
    pages = {p.relative_to(site).as_posix(): _parse(p) for p in site.rglob("*.html") if "_static" not in p.parts}
    seen, todo = set(), ["index.html"]
    broken = []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        here = (site / name).parent
        for src in pages[name].images:
            if _internal(src) and not (here / unquote(src)).resolve().is_file():
                broken.append(f"{name}: image {src}")
        for href in pages[name].hrefs:
            if not _internal(href):
                continue
            path, anchor = urldefrag(href)
            target = (here / unquote(path)).resolve() if path else (site / name).resolve()
            if target.is_dir():
                target = target / "index.html"
            rel = target.relative_to(site.resolve()).as_posix() if target.is_relative_to(site.resolve()) else None
            if rel is None or not target.is_file():
                broken.append(f"{name}: link {href}")
                continue
            if rel.endswith(".html") and rel in pages:
                if anchor and anchor not in pages[rel].ids:
                    broken.append(f"{name}: anchor {href}")
                todo.append(rel)
    assert not broken, broken
    sources = {
        p.relative_to(DOCS).with_suffix(".html").as_posix()
        for p in DOCS.rglob("*.md")
        if not p.relative_to(DOCS).parts[0].startswith("_")
    }
    unreachable = sorted(sources - seen)
    assert not unreachable, f"pages not reachable from the index: {unreachable}"
    for page in ("quickstart.html", "evaluate.html", "submit.html", "write-a-task.html", "release.html", "commands.html"):
        assert page in seen


def test_command_reference_is_the_parser(site):
    """Every subcommand and every option (its hidden aliases aside) of the program's own parser is on the command
    reference page."""
    import argparse

    from craftmd.commands.cli import build_parser

    html = (site / "commands.html").read_text(encoding="utf-8")
    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert len(subs.choices) >= 20
    missing = []
    for name, sub in subs.choices.items():
        if f'id="craftmd-{name}"' not in html:
            missing.append(name)
        for action in sub._actions:
            if action.help != argparse.SUPPRESS:
                missing += [f"{name} {o}" for o in action.option_strings if o not in html]
    assert not missing, f"not on the command reference: {missing[:20]}"


def test_task_pages_are_the_tasks_own(site):
    """Each built-in task's page holds its folder's README and what the registered task declares."""
    from craftmd.tasks import BUILTIN, get_task

    for name, package in BUILTIN.items():
        task = get_task(name)
        folder = ROOT / package.replace(".", "/")  # craftmd.tasks.diagnosis: craftmd/tasks/diagnosis
        readme = (folder / "README.md").read_text()
        html = (site / "tasks" / f"{name}.html").read_text(encoding="utf-8")
        title = readme.splitlines()[0].lstrip("# ").split(" (")[0]
        assert title.replace("'", "&#8217;").split(":")[0] in html or title.split(":")[0] in html
        for role in task.roles:
            assert f'<code class="docutils literal notranslate"><span class="pre">{role.name}</span></code>' in html
        for option in task.options.model_fields if task.options is not None else {}:
            assert f'<span class="pre">{option}</span>' in html, (name, option)


def test_layout_page_states_the_rooms_imports_as_they_are():
    """The room-to-room import table of the layout page is the code's: every import of every module, at any depth."""
    stated = stated_room_imports()
    assert set(stated) == set(ROOMS)
    actual = {}
    for room, folder in ROOMS.items():
        deps = set()
        for path in (ROOT / folder).rglob("*.py"):
            for name in _imports(path, _module(path)):
                deps |= {r for r in ROOMS if r != room and (name == f"craftmd.{r}" or name.startswith(f"craftmd.{r}."))}
        actual[room] = deps
    assert stated == actual


def test_markdown_tables_are_whole():
    """No table of the README or the site is broken by a blank line or a row of another width (a stale row)."""
    bad = []
    for path in [ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "craftmd" / "tasks").glob("*/README.md")]:
        lines = path.read_text().splitlines()
        fence = False
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fence = not fence
            if fence or not line.startswith("|"):
                continue
            width = len(re.split(r"(?<!\\)\|", line.strip())) - 2
            if i and lines[i - 1].startswith("|"):
                head = i
                while head and lines[head - 1].startswith("|"):
                    head -= 1
                if width != len(re.split(r"(?<!\\)\|", lines[head].strip())) - 2:
                    bad.append(f"{path.relative_to(ROOT)}:{i + 1}: a row of {width} cells")
            elif i >= 2 and not lines[i - 1].strip() and lines[i - 2].startswith("|"):
                bad.append(f"{path.relative_to(ROOT)}:{i + 1}: a row cut off from its table by a blank line")
    assert not bad, bad


def test_submission_example_runs_as_printed(dataset_dir, tmp_path):
    """The commands of "Submit outputs", as printed, on a small submission: it validates and is scored."""
    import json

    import polars as pl

    page = (DOCS / "submit.md").read_text()
    block = re.search(r"^```bash\n(.*?)^```", page, re.M | re.S)[1]
    commands = [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["craftmd", "validate"], ["craftmd", "submit"]]
    cases = pl.read_parquet(next((dataset_dir / "medqa_usmle").glob("*.parquet"))).head(3)
    with open(tmp_path / "answers.jsonl", "w") as f:
        for row in cases.iter_rows(named=True):
            line = {"case_id": row["case_id"], "trial": 0, "setting": "vignette", "format": "frq", "response": row["answer"]}
            f.write(json.dumps(line) + "\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "data").symlink_to(dataset_dir)
    craftmd = Path(sys.executable).parent / "craftmd"
    for argv in commands:
        run = subprocess.run([str(craftmd), *argv[1:]], cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, (argv, run.stderr[-2000:])
    scores = json.loads(next((tmp_path / "out" / "scored").rglob("scores.json")).read_text())
    assert scores  # the report the page promises
    assert list((tmp_path / "out" / "scored").glob("submission-*/manifest.json"))


def test_site_renders_in_a_browser(site, tmp_path):
    """The index and the command reference as a reader sees them, in headless Chromium: laid out, every image
    loaded, the navigation listing every section."""
    from test_leaderboard import CHROMIUM, DevTools

    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed (make browser, or apt-get install -y chromium)")
    b = DevTools(tmp_path / "profile")
    try:
        for page in ("index.html", "commands.html", "tasks/craftmd.html"):
            b.open((site / page).resolve().as_uri())
            assert b.js("document.title")
            assert b.js("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
            assert b.js("document.querySelector('article').getBoundingClientRect().height") > 200
        nav = b.js("Array.from(document.querySelectorAll('.sidebar-tree a')).map(a => a.textContent)")
        for title in ("Quick start", "Evaluate your model", "Submit outputs", "Write a task", "Commands"):
            assert title in nav, nav
    finally:
        b.close()
