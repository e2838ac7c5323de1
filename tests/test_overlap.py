"""Issue 44: the overlap between benchmarks, and training splits kept apart from every registered task's test cases.

Each registered task gives its test cases' texts (``Task.cases``); two cases of two tasks are the same case by the rule
the training sets are decontaminated by, applied both ways (:mod:`craftmd.overlap`). On a small constructed dataset the
pairs CRAFT-MD and the consultation task share are exactly those a brute-force reading of the rule finds (every pair of
texts compared, by code written here), and only pairs sharing an 8-gram are ever compared. A task file of one's own with
its own cases joins ``tables/overlap.csv`` with no change to the package; a MediQ line that is such a task's test case is
dropped from both training configs by ``craftmd build`` and counted under that task in its summary.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import Levenshtein
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from helpers import craftmd, generate_argv  # noqa: E402
from loopback import LoopbackServer, pick_upstream, write_replay_dataset  # noqa: E402

from craftmd import CraftMDError  # noqa: E402
from craftmd.commands.cli import main  # noqa: E402

A = (
    "A 45-year-old man comes to the emergency department because of crushing chest pain radiating to his left arm for one "
    "hour. He has hypertension and smokes one pack of cigarettes daily. His pulse is 110/min and blood pressure is 150/90 "
    "mm Hg. An ECG shows ST elevations in the anterior leads and his troponin is raised."
)
#: A with every sixth word from the thirteenth on changed by a letter: its first twelve words left whole (5 shared 8-grams,
#: a share near 0.1), a similarity far above 0.75: the same case by similarity alone
B = " ".join(w + "x" if i > 9 and i % 6 == 0 else w for i, w in enumerate(A.split()))
#: a short case, and a long one that holds its words verbatim: C's every 8-gram is in D (share 1.0), D's few are in C,
#: and their lengths differ too much for the similarity: the same case by C's share alone (the rule read both ways)
C = "A 6-year-old girl has an itchy rash with silvery scales on both elbows and knees for three months."
D = (
    "A 34-year-old teacher comes for a routine visit and asks about her daughter. She says that A 6-year-old girl has an "
    "itchy rash with silvery scales on both elbows and knees for three months, and wonders whether it is contagious. "
    "She herself is well, takes no medications, runs twice a week, and her blood pressure is 118/76 mm Hg today. Her "
    "father had a stroke at 66, her mother has type 2 diabetes, and she has not had a mammogram in three years."
)
#: an unrelated case sharing one 8-gram with A: found through the index, then below both thresholds
E = (
    "A 70-year-old woman who comes to the emergency department because of crushing headaches every morning for two weeks "
    "has lost weight, feels tired, and her daughter says she forgets appointments; she lives alone with two cats."
)
F = "A 28-year-old woman presented with a painless ulcer on her lower lip that had grown over one month."


def write_dataset(root: Path, text_cases: dict[str, str], image_cases: dict[str, str]) -> Path:
    """A dataset folder of two configs with the columns the CRAFT-MD tasks read their cases from (case_id, vignette)."""
    for config, cases in (("all", text_cases), ("nejm_image", image_cases)):
        (root / config).mkdir(parents=True)
        pl.DataFrame({"case_id": list(cases), "vignette": list(cases.values())}).write_parquet(
            root / config / "test-00000-of-00001.parquet"
        )
    return root


def norm(t: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", "", t.lower())).strip()


def grams(t: str) -> set:
    w = t.split()
    return {tuple(w[i : i + 8]) for i in range(len(w) - 7)}


def by_hand(a: dict[str, str], b: dict[str, str]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """The rule read literally, every pair of texts compared: (id a, id b) -> (similarity, share of a, share of b) for each
    pair that shares a word 8-gram and reaches similarity 0.75 or a share of 0.2 either way."""
    out = {}
    for ia, ta in a.items():
        for ib, tb in b.items():
            na, nb = norm(ta), norm(tb)
            ga, gb = grams(na), grams(nb)
            k = len(ga & gb)
            sim = 1 - Levenshtein.distance(na, nb) / max(len(na), len(nb))
            if k and (sim >= 0.75 or k / len(ga) >= 0.2 or k / len(gb) >= 0.2):
                out[ia, ib] = (round(sim, 4), round(k / len(ga), 4), round(k / len(gb), 4))
    return out


@pytest.fixture
def folder_tasks_only(tmp_path, monkeypatch):
    """The registry without the tasks whose cases come from elsewhere than the dataset folder (a pinned source read in
    place): these tests pose cases in a folder of their own."""
    from craftmd.tasks import TASKS, builtin_tasks

    empty = tmp_path / "empty"
    empty.mkdir()
    for task in list(builtin_tasks().values()):
        if task.cases is not None and task.cases(empty) is not None:
            monkeypatch.delitem(TASKS, task.name)


def test_the_cases_two_tasks_share_are_exactly_what_the_rule_says(tmp_path, monkeypatch, folder_tasks_only):
    import craftmd.overlap as O

    texts = {"case_1": A, "case_2": B, "case_3": C, "case_4": D, "case_5": E}
    data = write_dataset(tmp_path / "data", texts, {"case_1": F})
    found = O.task_cases([data])
    # CRAFT-MD poses the text and the image cases (an image case whose id a text case has: nejm_image/<id>); the
    # consultation task the text cases; the encounters' packets are not in this folder, and the overlap says so
    assert found.texts["craftmd"] == {**texts, "nejm_image/case_1": F} and found.texts["consultation"] == texts
    assert found.missing["encounters"] == "its cases are not in the dataset folders read"

    compared = []
    similar = O.similar
    monkeypatch.setattr(O, "similar", lambda a, b: compared.append((a, b)) or similar(a, b))
    rows = O.same_cases(found)
    got = {(r["case_a"], r["case_b"]): (r["similarity"], r["share_a"], r["share_b"]) for r in rows}
    assert got == by_hand(found.texts["craftmd"], found.texts["consultation"])
    assert set(got) == {
        *((c, c) for c in texts),  # every case of the one dataset is itself in the other task
        ("case_1", "case_2"), ("case_2", "case_1"),  # a light rewording: by similarity (its share is about 0.1)
        ("case_3", "case_4"), ("case_4", "case_3"),  # a case told inside another: by the short one's share alone
    }  # fmt: skip
    assert got["case_1", "case_2"][0] > 0.9 and got["case_1", "case_2"][1] < 0.2
    assert got["case_3", "case_4"][1:] == (1.0, got["case_4", "case_3"][1]) and got["case_4", "case_3"][1] < 0.2
    assert ("case_1", "case_5") not in got  # one 8-gram in common, found by the index, below both thresholds
    assert all(r["task_a"] == "craftmd" and r["task_b"] == "consultation" for r in rows)
    # only pairs that share an 8-gram are found (an index, not every pair of texts), and of those only the ones the
    # shares do not decide get an edit distance: A, B and E with each other (B keeps the 8-gram A shares with E), both
    # ways, 6 of the 30 pairs
    undecided = {
        (norm(x), norm(y))
        for x in found.texts["craftmd"].values()
        for y in found.texts["consultation"].values()
        if 0 < len(grams(norm(x)) & grams(norm(y))) < 0.2 * min(len(grams(norm(x))), len(grams(norm(y))))
    }
    assert len(compared) == len(undecided) == 6 and set(compared) == undecided
    assert O.pair_counts(found, rows) == [
        {"task_a": "craftmd", "task_b": "consultation", "cases_a": 6, "cases_b": 5, "same_dataset": True, "pairs": 9,
         "cases_a_shared": 5, "cases_b_shared": 5},
    ]  # fmt: skip


def test_one_benchmark_of_every_task_and_the_environments_check_it(tmp_path, monkeypatch, folder_tasks_only):
    """A training case that is another registered task's test case is refused where a training split is posed."""
    from craftmd.dataset_builder import golden as G
    from craftmd.tasks import TASKS, Experiment, Task

    data = write_dataset(tmp_path / "data", {"case_1": A, "case_2": C}, {"case_1": F})
    other = Task("othercases", "a task of one's own", "othercases", (Experiment("x", "text"),),
                 cases=lambda d: {"case_1": E, "oc_2": D})  # fmt: skip
    monkeypatch.setitem(TASKS, other.name, other)
    bench = G.benchmark_texts(data, "craftmd")
    # CRAFT-MD's keys as before, the consultation's the same cases (one key each), the other task's under its own ids,
    # and its case_1 (another text under a CRAFT-MD id) as othercases/case_1
    assert bench == {"case_1": A, "case_2": C, "nejm_image/case_1": F, "othercases/case_1": E, "oc_2": D}
    G.check_disjoint("train", {"t_1": "A 3-year-old boy has had a barking cough and a fever since last night."}, bench)
    with pytest.raises(CraftMDError, match=r"1 training case\(s\) are benchmark cases by text, first t_1 ~ oc_2"):
        G.check_disjoint("train", {"t_1": D}, bench)
    with pytest.raises(CraftMDError, match="not a built dataset of consultation"):
        G.benchmark_texts(tmp_path, "consultation")


def test_a_case_file_that_cannot_be_read_is_one_line(tmp_path):
    from craftmd.overlap import task_cases

    data = write_dataset(tmp_path / "data", {"case_1": A}, {"case_1": F})
    (data / "nejm_image" / "test-00000-of-00001.parquet").write_bytes(b"not parquet")
    with pytest.raises(CraftMDError, match=r"nejm_image/test-00000-of-00001.parquet: cannot read its case_id and vignette"):
        task_cases([data])
    (data / "nejm_image" / "test-00000-of-00001.parquet").unlink()  # a folder without image cases: its text cases only
    assert task_cases([data]).texts["craftmd"] == {"case_1": A}


TASK_FILE = """
\"\"\"A benchmark of one's own: its cases are a JSON file beside this file.\"\"\"

import json
from pathlib import Path

from craftmd.tasks import Experiment, Task, register


def cases(dataset_dir):
    return json.loads((Path(__file__).parent / "mycases.json").read_text())


TASK = register(Task(name="mycases", description="a benchmark of one's own", dataset="mycases",
                     experiments=(Experiment("x", "text"),), cases=cases))
"""


def _task_file(folder: Path, cases: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mycases.json").write_text(json.dumps(cases))
    (folder / "mycases.py").write_text(TASK_FILE)
    return folder / "mycases.py"


def test_a_task_file_with_its_own_cases_joins_the_overlap_table(source, tmp_path, monkeypatch):
    oneword = Path(__file__).parent / "fixtures" / "oneword" / "oneword.py"
    data = tmp_path / "data"
    write_replay_dataset(pick_upstream(source, 2, seed=2, max_messages=12), data)
    f = data / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer")).write_parquet(f)
    first, vignette = pl.read_parquet(f).row(0)[0], pl.read_parquet(f)["vignette"][0]
    mine = _task_file(tmp_path / "mine", {"my_1": vignette + " She has no allergies.", "my_2": E})
    releases, site = tmp_path / "releases", tmp_path / "site"
    with LoopbackServer(lambda request: "dermatitis", models=("m",)) as server:  # any graded release will do
        monkeypatch.setenv("TOY_BASE_URL", server.base_url)
        argv = generate_argv(data, "--role", "patient=openai-api/toy/m", task=oneword, doctor="openai-api/toy/m", patient="",
                             cache=tmp_path / "c.sqlite", out=releases / "toy")  # fmt: skip
        assert main(argv) == 0
    env = dict(os.environ, CRAFTMD_TASKS=os.pathsep.join([str(oneword), str(mine)]))
    assert craftmd("score", releases / "toy", "--dataset", data, "--quiet", env=env).returncode == 0
    craftmd("analyse", "--releases", releases, "--dataset", data, "--out", site, "--page", "--resamples", "50", env=env)
    rows = pl.read_csv(site / "tables" / "overlap.csv").filter(pl.col("task_b") == "mycases")
    assert rows.select("task_a", "case_a", "case_b").rows() == [("craftmd", first, "my_1"), ("consultation", first, "my_1")]
    counts = {(r["task_a"], r["task_b"]): r for r in pl.read_csv(site / "tables" / "overlap_pairs.csv").iter_rows(named=True)}
    assert counts["craftmd", "mycases"]["pairs"] == 1 and counts["craftmd", "mycases"]["cases_b"] == 2
    assert not counts["craftmd", "mycases"]["same_dataset"] and counts["craftmd", "consultation"]["same_dataset"]
    page = (site / "index.html").read_text()
    section = page[page.index('id="overlap"') : page.index('id="trust"')]
    assert '<td class="txt">mycases</td>' in section and 'href="tables/overlap.csv"' in section
    assert "oneword (it declares no cases)" in section  # a task without cases is named, not left out


def test_a_training_candidate_that_is_another_tasks_case_is_dropped_and_counted(dataset_dir, tmp_path):
    """`craftmd build` keeps both training configs apart from a task file's cases too: the MediQ line that is one of them
    is dropped from each, listed under that task in build_report.md, and counted in the summary."""
    kept = pl.read_parquet(dataset_dir / "craftmd_train" / "train-00000-of-00001.parquet")
    golden = pl.read_parquet(dataset_dir / "consult_train" / "train-00000-of-00001.parquet")
    both = {c.removeprefix("mediq:") for c in golden["case"]}
    victim = next(r for r in kept.iter_rows(named=True) if r["case_id"].removeprefix("train_mediq_") in both)
    mediq = victim["case_id"].removeprefix("train_mediq_")  # a training case of both configs without the task file
    mine = _task_file(tmp_path / "mine", {"my_7": victim["vignette"], "my_8": E})
    out = tmp_path / "built"
    proc = craftmd("build", "--out", out, "--quiet", env=dict(os.environ, CRAFTMD_TASKS=str(mine)))
    assert (
        "training configs kept apart from the test cases of craftmd (2,037), consultation (2,004), agentclinic (456), mycases (2)"
        in proc.stdout
    )
    assert "not checked against encounters (its cases are not in the dataset folders read" in proc.stdout
    lines = [ln for ln in proc.stdout.splitlines() if "dropped as benchmark cases" in ln]
    assert len(lines) == 2 and all("mycases 1" in ln for ln in lines)
    now = pl.read_parquet(out / "craftmd_train" / "train-00000-of-00001.parquet")
    assert set(kept["case_id"]) - set(now["case_id"]) == {victim["case_id"]} and now.height == kept.height - 1
    now_golden = pl.read_parquet(out / "consult_train" / "train-00000-of-00001.parquet")
    assert set(golden["case"]) - set(now_golden["case"]) == {f"mediq:{mediq}"}
    report = (out / "build_report.md").read_text()
    assert f"| mediq:{mediq} | my_7 | mycases | 1.0000 | 1.0000 |" in report
    # the test configs are byte for byte the build's without the task file
    for config in ("all", "nejm_image", "medqa_usmle"):
        path = f"{config}/test-00000-of-00001.parquet"
        assert (out / path).read_bytes() == (dataset_dir / path).read_bytes()


def test_the_pairs_of_the_same_cases_are_read_back_and_a_change_or_a_damaged_file_computes_them_again(tmp_path, monkeypatch):
    """Comparing every task's case texts takes seconds of every analysis; an analysis of the same cases (and the same
    rule) reads back the pairs an earlier one kept, the same rows; another text, or a kept file that is not those
    rows, is compared again."""
    import craftmd.overlap
    from craftmd.analysis.overlap import kept_same_cases
    from craftmd.overlap import TaskCases

    monkeypatch.setenv("CRAFTMD_CACHE", str(tmp_path / "cache"))
    same = "a woman of forty comes with a cough and a fever that began three days ago after a trip"
    found = TaskCases(texts={"one": {"c1": same, "c2": "nothing alike at all here"}, "two": {"d1": same + " abroad"}})
    calls = []
    real = craftmd.overlap.same_cases
    monkeypatch.setattr(craftmd.overlap, "same_cases", lambda f: calls.append(1) or real(f))
    first = kept_same_cases(found)
    assert first == real(found) and [(r["case_a"], r["case_b"]) for r in first] == [("c1", "d1")] and len(calls) == 1
    assert kept_same_cases(found) == first and len(calls) == 1  # read back: nothing compared
    (kept,) = (tmp_path / "cache" / "overlap").iterdir()
    for damage in (b"not json", b"[{}]", json.dumps([dict(first[0], similarity="1")]).encode()):
        kept.write_bytes(damage)
        assert kept_same_cases(found) == first and json.loads(kept.read_text()) == first  # computed again, kept again
    assert len(calls) == 4
    found.texts["two"]["d1"] = "a man of ninety with a broken hip"
    assert kept_same_cases(found) == [] and len(calls) == 5  # another text: another key
