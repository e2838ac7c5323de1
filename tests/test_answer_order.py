"""CRAFT-MD's answer order (``-T answer_order``): shuffled, each case, trial and format shows its options in its own
permutation from the recorded seed; the ``strict`` rule reads a letter against the options as they were shown; the
option is part of the protocol; the analysis reports a model's accuracy in the two orders with a paired CI. The
default is upstream's order (the replay of upstream's prompts, tests/test_upstream_replay.py, holds it byte for byte).

The doctor is a loopback model with a position bias: it answers every four-choice question with the letter ``A``, so its
accuracy moves with the order, as small models' does.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil

import polars as pl
import pytest

from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.release import protocol_differences, read_release
from craftmd.tasks import get_task
from craftmd.answer_order import permutation, shown
from helpers import assert_tables_documented, generate_argv
from loopback import LoopbackServer, text_of

REPLAY = {"n": 4, "seed": 11, "max_messages": 12}
TRIALS = 2


def test_a_permutation_is_the_documented_rule_and_nothing_else():
    """Position i goes where sha256("seed/case/trial/format/i") sorts: the same on any machine, for any run order."""
    for n, case, trial, fmt, seed in [(4, "case_7", 0, "mcq4", 0), (4, "case_7", 1, "mcq4", 0), (16, "x", 3, "mcq_many", 9)]:
        rule = sorted(range(n), key=lambda i: hashlib.sha256(f"{seed}/{case}/{trial}/{fmt}/{i}".encode()).digest())
        assert permutation(n, case, trial, fmt, seed) == rule and sorted(rule) == list(range(n))
    # every option is shown first for some case, and the trials of one case are shown in their own orders
    assert {permutation(4, f"case_{i}", 0, "mcq4", 0)[0] for i in range(40)} == {0, 1, 2, 3}
    assert sum(permutation(4, f"case_{i}", 0, "mcq4", 0) != permutation(4, f"case_{i}", 1, "mcq4", 0) for i in range(40)) > 30
    assert shown(["a", "b", "c", "d"], "case_7", 0, "mcq4", "upstream", 0) == ["a", "b", "c", "d"]  # the default
    assert shown(["a", "b"], "case_7", 0, "frq", "shuffled", 0) == ["a", "b"]  # free response has no options to order


def test_the_option_is_typed_and_its_seed_needs_it():
    task = get_task("craftmd")
    assert task.protocol_options(task.parse_options({})) == {}  # the default: nothing recorded, the protocol as before
    o = task.parse_options({"answer_order": "shuffled", "order_seed": "5"})
    assert task.protocol_options(o) == {"answer_order": "shuffled", "order_seed": 5}
    for bad, what in (({"answer_order": "reversed"}, "answer_order"), ({"order_seed": "5"}, "answer_order=shuffled")):
        with pytest.raises(CraftMDError, match=what) as e:
            task.parse_options(bad)
        assert "\n" not in str(e.value)


class LetterA:
    """The doctor and the patient: every question that lists a case's four choices is answered "A", a many-choice
    question with the option shown first; the rest get a line.
    Keeps, per (vignette, format), the options in the order each question showed them."""

    def __init__(self, cases: pl.DataFrame, many: list[str]):
        self.cases = cases.select("case_id", "vignette", "choices").to_dicts()
        self.many = many
        self.seen: list[tuple[str, str, list[str]]] = []  # (case id, format, options as shown)

    def __call__(self, req: dict) -> str:
        text = "\n".join(text_of(m["content"]) for m in req["messages"])
        for c in self.cases:
            if c["vignette"][:200] not in text:
                continue
            for p in itertools.permutations(c["choices"]):
                if ", ".join(p) in text or "\n".join(f"- {o}" for o in p) in text:
                    self.seen.append((c["case_id"], "mcq4", list(p)))
                    return "A"
            listed = [ln[2:] for ln in text.splitlines() if ln.startswith("- ") and ln[2:] in self.many]
            if len(listed) == len(self.many):
                self.seen.append((c["case_id"], "mcq_many", listed))
                return listed[0]  # the option shown first
        return "I am not sure."


@pytest.fixture(scope="module")
def graded(tiny_dataset, tmp_path_factory):
    """Two releases of one loopback doctor, in upstream's order and shuffled, graded by the MCQ rules; what it was shown."""
    tmp = tmp_path_factory.mktemp("order")
    data = shutil.copytree(tiny_dataset, tmp / "data")
    cases = pl.read_parquet(data / "all" / "test-00000-of-00001.parquet")
    cases.with_columns(paper_answer=pl.col("answer")).write_parquet(data / "all" / "test-00000-of-00001.parquet")
    many = pl.read_parquet(data / "diagnoses" / "test-00000-of-00001.parquet")["diagnosis"].to_list()
    doctor = LetterA(cases, many)
    rels = tmp / "releases"
    seen = {}
    with LoopbackServer(doctor) as server:
        for name, options in (("upstream", []), ("shuffled", ["-T", "answer_order=shuffled"])):
            doctor.seen = []
            argv = generate_argv(data, "--experiments", "vignette,mcq4,mcq_many", "--trials", TRIALS, *options,
                                 base_url=server.base_url, cache=tmp / "cache.sqlite", out=rels / name)  # fmt: skip
            assert cli_main(argv) == 0
            scored = ["score", str(rels / name), "--dataset", str(data), "--scorer", "paper", "--scorer", "strict", "--quiet"]
            assert cli_main(scored) == 0
            seen[name] = list(doctor.seen)
    return data, cases, many, rels, seen


def test_shuffled_questions_show_each_case_and_trial_its_permutation(graded):
    data, cases, many, rels, seen = graded
    choices = {r["case_id"]: r["choices"] for r in cases.to_dicts()}
    answers = read_release(rels / "shuffled").table("answers").to_pylist()
    assert len(answers) == 2 * TRIALS * cases.height  # every case, trial and format was asked
    # the requests do not say which trial they are of: each shown order is one of its case's trials' permutations
    for case, fmt, options in seen["upstream"]:
        assert options == (choices[case] if fmt == "mcq4" else many)  # the default: upstream's order, untouched
    for case, fmt, options in seen["shuffled"]:
        given = choices[case] if fmt == "mcq4" else many
        assert options in [shown(given, case, t, fmt, "shuffled", 0) for t in range(TRIALS)]
    moved = [(c, o) for c, f, o in seen["shuffled"] if f == "mcq4" and o != choices[c]]
    assert moved  # (some order is not upstream's: the doctor was shown something else)


def test_the_strict_rule_reads_a_letter_against_the_options_as_shown(graded):
    data, cases, many, rels, seen = graded
    key = {r["case_id"]: (r["choices"], r["answer"]) for r in cases.to_dicts()}
    for name, order in (("upstream", "upstream"), ("shuffled", "shuffled")):
        scores = pl.read_parquet(rels / name / "scores.parquet").filter(pl.col("scorer") == "strict", pl.col("format") == "mcq4")
        assert scores.height == TRIALS * cases.height
        for r in scores.to_dicts():
            choices, answer = key[r["case_id"]]
            first = shown(choices, r["case_id"], r["trial"], "mcq4", order, 0)[0]  # "A": the option shown first
            assert r["value"] == float(first == answer), (name, r["case_id"], r["trial"])
    up = pl.read_parquet(rels / "upstream" / "scores.parquet").filter(pl.col("scorer") == "strict", pl.col("format") == "mcq4")
    sh = pl.read_parquet(rels / "shuffled" / "scores.parquet").filter(pl.col("scorer") == "strict", pl.col("format") == "mcq4")
    assert up["value"].to_list() != sh["value"].to_list()  # the position-biased doctor scores differently in the two orders


def test_the_order_is_part_of_the_protocol_and_said_in_words(graded):
    _, _, _, rels, _ = graded
    up, sh = (read_release(rels / n).manifest for n in ("upstream", "shuffled"))
    assert "options" not in json.loads((rels / "upstream" / "manifest.json").read_text())["protocol"]  # as before
    assert sh.protocol.options == {"answer_order": "shuffled"} and sh.notes["answer_order"] == "shuffled"
    assert up.protocol.key() != sh.protocol.key()
    assert protocol_differences(sh.protocol, up.protocol) == ["-T answer_order=shuffled vs default"]


def test_the_analysis_reports_the_order_effect_with_a_paired_ci(graded, tmp_path):
    from craftmd.analysis.tables import compute, write_tables

    data, cases, _, rels, _ = graded
    a = compute(rels, data, B=400)
    t = a.order_tests
    assert t is not None
    row = t.filter(pl.col("setting") == "vignette", pl.col("format") == "mcq4", pl.col("grader") == "strict").to_dicts()
    assert len(row) == 1
    row = row[0]
    assert (row["model"], row["upstream_release"], row["other_release"], row["answer_order"], row["n_cases"]) == (
        "openai/loopback", "upstream", "shuffled", "shuffled", cases.height)  # fmt: skip
    # the accuracies are the case means of the trial means; the difference theirs, inside its interval
    acc = {}
    for name in ("upstream", "shuffled"):
        s = pl.read_parquet(rels / name / "scores.parquet").filter(pl.col("scorer") == "strict", pl.col("format") == "mcq4")
        acc[name] = s.group_by("case_id").agg(pl.col("value").mean())["value"].mean()
    assert row["upstream_accuracy"] == pytest.approx(acc["upstream"]) and row["other_accuracy"] == pytest.approx(acc["shuffled"])
    assert row["diff"] == pytest.approx(acc["shuffled"] - acc["upstream"])
    assert row["ci_low"] <= row["diff"] <= row["ci_high"] and row["ci_low"] < row["ci_high"] and 0 < row["p_value"] <= 1
    write_tables(a, tmp_path)
    assert (tmp_path / "tables" / "order_tests.csv").is_file()
    assert_tables_documented(tmp_path / "tables")
    # a board without runs in two orders writes no such table
    alone = tmp_path / "alone"
    shutil.copytree(rels / "upstream", alone / "upstream")
    assert compute(alone, data, B=50).order_tests is None


def test_the_page_shows_the_order_effect_beside_the_mcq_rules_and_nothing_of_it_without_such_runs(graded, tmp_path):
    """The page (HTML and its markdown twin) shows tables/order_tests.csv in the MCQ section, every row with its numbers;
    a board without runs in two orders shows nothing of it (the published page unchanged)."""
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import compute
    from craftmd.cards.render import fixed, p_value, signed

    data, cases, _, rels, _ = graded
    a = compute(rels, data, B=50)
    write_page(a, tmp_path / "both")
    html, md = ((tmp_path / "both" / n).read_text() for n in ("index.html", "leaderboard.md"))
    assert html.index('id="mcq-rules"') < html.index('id="answer-order"') < html.index('id="frq-graders"')
    table = html.split('id="answer-order-table"')[1].split("</table>")[0]
    rows = table.split("<tbody>")[1].split("</tr>")[:-1]
    assert len(rows) == a.order_tests.height > 0
    for row, r in zip(rows, a.order_tests.to_dicts()):
        cells = [c.split("</td>")[0] for c in row.split("<td")[1:]]
        assert cells[1].endswith(f"<code>{r['upstream_release']}</code> / <code>{r['other_release']}</code> (shuffled)")
        assert cells[5:] == [
            f">{r['n_cases']}",
            f">{fixed(r['upstream_accuracy'])}",
            f">{fixed(r['other_accuracy'])}",
            f'>{signed(r["diff"])}<span class="ci">{signed(r["ci_low"])}–{signed(r["ci_high"])}</span>',
            f">{p_value(r['p_value'])}",
        ], cells
    assert 'href="tables/order_tests.csv"' in html
    assert "## MCQ: shuffled choices against upstream's order" in md
    assert md.count("| `upstream` / `shuffled` (shuffled) |") == len(rows)

    alone = tmp_path / "alone"
    shutil.copytree(rels / "upstream", alone / "upstream")
    write_page(compute(alone, data, B=50), tmp_path / "one")
    html, md = ((tmp_path / "one" / n).read_text() for n in ("index.html", "leaderboard.md"))
    assert "answer-order" not in html and "order_tests" not in html and "shuffled" not in md and "order_tests" not in md


def test_a_scorer_given_the_rows_alone_reads_the_order_from_its_context(graded):
    """inspect's scorers grade a sample's rows without a release: the run's protocol options come in the context."""
    from craftmd.scoring.scorers import Context, ScoreRows, get_scorer

    data, _, _, rels, _ = graded
    rows = [a for a in read_release(rels / "shuffled").table("answers").to_pylist() if a["format"] == "mcq4"]
    written = pl.read_parquet(rels / "shuffled" / "scores.parquet").filter(
        pl.col("scorer") == "strict", pl.col("format") == "mcq4"
    )
    want = {(r["case_id"], r["trial"]): r["value"] for r in written.to_dicts()}
    got = {}
    for options in ({"answer_order": "shuffled"}, {}):
        out = ScoreRows()
        get_scorer("strict").score(rows, Context(data, progress=False, options={"protocol": options}), out)
        got[bool(options)] = {(r["case_id"], r["trial"]): r["value"] for r in out.table().to_pylist() if r["metric"] == "correct"}
    assert got[True] == want and got[False] != want  # told the order: the release's grades; not told: upstream's order
