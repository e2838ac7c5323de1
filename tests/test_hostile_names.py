"""Names and claims that reach the page: a model's name is escaped for each medium it is shown in (figures,
CSV tables, the markdown and HTML pages), and a submission's answers in conversational settings count only
with the conversations behind them; without, they are listed apart as self-reported, never ranked."""

from __future__ import annotations

import shutil

import polars as pl
import pyarrow.compute as pc
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main
from craftmd.release import read_release
from craftmd.scoring.submission import submission_id

from helpers import submit_argv

HOSTILE = {  # name -> how leaderboard.md must show it
    "evil$\\frac{$x": "evil$\\frac{$x (submission)",
    '=HYPERLINK("http://x","y")': '=HYPERLINK("http://x","y") (submission)',
    "a|b": "a\\|b (submission)",
    "<script>alert(1)</script>": "&lt;script&gt;alert(1)&lt;/script&gt; (submission)",
}


def _submission(path, rows: pl.DataFrame):
    rows.select("case_id", "trial", "setting", "format", "response").write_parquet(path)
    return path


@pytest.fixture(scope="module")
def site(dataset_dir, releases_dir, tmp_path_factory):
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import analyse
    from craftmd.dataset import load_config
    from craftmd.scoring.submission import submit

    root = tmp_path_factory.mktemp("names")
    releases = root / "releases"
    releases.mkdir()
    shutil.copytree(releases_dir / "gpt3_1106", releases / "gpt3_1106")
    gpt35 = read_release(releases / "gpt3_1106")
    answers = pl.from_arrow(gpt35.table("answers")).filter(pl.col("trial") == 0, ~pl.col("with_image"))
    vignette = answers.filter(pl.col("setting") == "vignette", pl.col("format") == "mcq4")
    for i, name in enumerate(HOSTILE):  # one answer told apart: one set of answers under two ids is one run (refused)
        mine = vignette.with_columns(
            response=pl.when(pl.int_range(pl.len()) == 0).then(pl.col("response") + f" ({i})").otherwise(pl.col("response"))
        )
        submit(_submission(root / f"vignette{i}.parquet", mine), dataset_dir, name, releases, graders=["paper"], progress=False)
    # Answers that copy the dataset's answer text, in the multi-turn setting, with no conversation behind them.
    ds = load_config(dataset_dir, "all")
    copied = ds.select(
        "case_id",
        trial=pl.lit(0),
        setting=pl.lit("multiturn"),
        format=pl.lit("frq"),
        response=pl.lit("**Final Diagnosis:** ") + pl.col("answer"),
    )
    submit(_submission(root / "copy.parquet", copied), dataset_dir, "acme/copycat", releases, graders=["offline"], progress=False)
    # GPT-3.5's own multi-turn answers, submitted with their conversations: checked and ranked.
    conv = gpt35.table("conversations")
    conv = conv.filter(pc.and_(pc.equal(conv.column("trial"), 0), pc.equal(conv.column("conversation"), "standard")))
    conv_file = root / "conversations.parquet"
    pl.from_arrow(conv).write_parquet(conv_file)
    multiturn = _submission(
        root / "multiturn.parquet", answers.filter(pl.col("setting") == "multiturn", pl.col("format") == "frq")
    )
    from craftmd.generation.ingest import upstream_protocol

    stated = root / "protocol.json"  # the paper's protocol, stated: a submission of another or none is never ranked with it
    stated.write_text(upstream_protocol().model_dump_json())
    submit(
        multiturn,
        dataset_dir,
        "acme/with-conversations",
        releases,
        graders=["offline"],
        progress=False,
        conversations=conv_file,
        protocol=stated,
    )
    out = root / "site"
    a = analyse(releases, dataset_dir, out, B=100)
    write_page(a, out)
    return {"out": out, "root": root, "multiturn": multiturn, "conv": conv_file}


def test_hostile_names_are_escaped_in_every_medium(site):
    out = site["out"]
    assert (out / "figures" / "settings.png").stat().st_size > 1000  # mathtext off: "evil$\frac{$x" drawn as text
    releases = pl.read_csv(out / "tables" / "releases.csv")
    display = dict(zip(releases["release"], releases["display"]))
    assert display["gpt3_1106"] == "GPT-3.5"
    assert display[submission_id('=HYPERLINK("http://x","y")')] == '\'=HYPERLINK("http://x","y") (submission)'
    model = dict(zip(releases["release"], releases["model"]))
    assert model[submission_id('=HYPERLINK("http://x","y")')] == '\'=HYPERLINK("http://x","y")'
    md = (out / "leaderboard.md").read_text()
    assert "<script>" not in md
    lines = md.splitlines()
    for name, shown in HOSTILE.items():
        at = next(i for i, line in enumerate(lines) if f"| {shown} |" in line)
        header = next(lines[i] for i in range(at, -1, -1) if lines[i].startswith("| # | Model"))  # its own table's
        assert lines[at].replace("\\|", "").count("|") == header.count("|"), lines[at]  # no column shifted
    page = (out / "index.html").read_text()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_answers_without_their_conversations_are_self_reported_never_ranked(site):
    out = site["out"]
    md = (out / "leaderboard.md").read_text()
    board = md[: md.index("## Self-reported submissions")]
    apart = md[md.index("## Self-reported submissions") : md.index("## MCQ")]
    assert "acme/copycat" not in board
    copy = next(line for line in apart.splitlines() if line.startswith("| acme/copycat (submission) | submission | "))
    assert float(copy.split("|")[3].split()[0]) > 0.9  # it would have led the board by far
    assert "| 2 | acme/with-conversations (submission) | submission |" in board  # checked conversations: ranked
    page = (out / "index.html").read_text()
    ranked = page[page.index('id="leaderboard"') : page.index("</table>", page.index('id="leaderboard"'))]
    assert "acme/copycat" not in ranked and "acme/with-conversations" in ranked
    lead = page[page.index('class="lead"') : page.index('id="board"')]
    assert "copycat" not in lead
    section = page[page.index('id="self-reported"') :]
    assert "acme/copycat (submission)" in section[: section.index("</table>")]
    rel = read_release(site["root"] / "releases" / submission_id("acme/with-conversations"))
    assert rel.has("conversations") and rel.manifest.source["conversations_file"] == "conversations.parquet"


def test_conversations_are_checked_like_a_release(site, dataset_dir, tmp_path, capsys):
    conv = pl.read_parquet(site["conv"])

    def score(conv_file) -> str:
        code = main(submit_argv(site["multiturn"], dataset_dir, "acme/m", tmp_path / "o", "--conversations", conv_file))
        assert code == 2 and not (tmp_path / "o").exists()
        return capsys.readouterr().err.strip()

    short = tmp_path / "short.parquet"
    conv.slice(1).write_parquet(short)
    assert "answer(s) in conversational settings have no conversation, e.g. case_" in score(short)
    stray = tmp_path / "stray.parquet"
    pl.concat([conv, conv.head(1).with_columns(case_id=pl.lit("case_999999"))]).write_parquet(stray)
    assert "1 conversation(s) of cases not in the dataset, e.g. 'case_999999'" in score(stray)
    bad = tmp_path / "bad.parquet"
    conv.with_columns(ended=pl.lit("bored")).write_parquet(bad)
    assert "conversations.ended: unknown value(s) ['bored']" in score(bad)
    dup = tmp_path / "dup.parquet"
    pl.concat([conv, conv.head(1)]).write_parquet(dup)
    assert "conversations: duplicate rows for the key" in score(dup)
    with pytest.raises(CraftMDError, match="no such parquet file"):
        from craftmd.scoring.submission import read_conversations

        read_conversations(tmp_path / "nothing.parquet", None, dataset_dir)
