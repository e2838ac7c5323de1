"""A new protocol is one task file plus its prompts (issues #21, #31): ``tests/fixtures/oneword/`` holds a toy task of
two roles and one option, its protocol, its scorer and its prompts, and nothing in the package knows it. It is generated
by the one runner (``craftmd generate --task FILE -T words=2``, ``--estimate`` too), scored with ``craftmd score`` and
shown on the page, the last two in other processes that find it through ``$CRAFTMD_TASKS``; ``--task FILE --help``
lists its roles and options, and a bad option or role is one line that writes nothing."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from craftmd.commands.cli import main
from craftmd.release import read_release

sys.path.insert(0, str(Path(__file__).parent))
from helpers import craftmd, generate_argv  # noqa: E402
from loopback import LoopbackServer, pick_upstream, write_replay_dataset  # noqa: E402

TASK_FILE = Path(__file__).parent / "fixtures" / "oneword" / "oneword.py"


@pytest.fixture(scope="module")
def tiny_dataset(source, tmp_path_factory):
    import polars as pl

    out = tmp_path_factory.mktemp("oneword") / "data"
    write_replay_dataset(pick_upstream(source, 3, seed=2, max_messages=12), out)
    f = out / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer")).write_parquet(f)  # what a built dataset has
    return out


def answer(request: dict) -> str:
    """The patient: its complaint (by the vignette's length); the doctor: one, two or three words, by the complaint's."""
    if request["messages"][0]["content"].startswith("You are a patient"):
        return "It itches: " + " ".join(request["messages"][0]["content"].split()[7:15])  # its own words, from its case
    return " ".join(["dermatitis"] * (1 + len(request["messages"][-1]["content"]) % 3))


def test_a_task_file_is_generated_scored_and_shown(tiny_dataset, tmp_path, monkeypatch, capsys):
    releases, site = tmp_path / "releases", tmp_path / "site"
    rel = releases / "toy-doctor"
    with LoopbackServer(answer, models=("m",)) as server:
        monkeypatch.setenv("TOY_BASE_URL", server.base_url)
        options = ("--role", "patient=openai-api/toy/m", "-T", "words=2", "--trials", "2")
        where = {"cache": tmp_path / "cache.sqlite", "out": rel}
        common = generate_argv(tiny_dataset, *options, task=TASK_FILE, doctor="openai-api/toy/m", patient="", **where)
        assert main([*common, "--estimate"]) == 0 and server.calls == 0
        est = capsys.readouterr().out
        assert "task oneword: 6 jobs" in est and "openai-api/toy/m" in est
        assert main(common) == 0
        assert server.calls == 12  # the patient and the doctor, per case and trial
        prompts = {r["messages"][0]["content"] for r in server.log}
    doctor = (TASK_FILE.parent / "prompts" / "oneword-v1" / "doctor.txt").read_text()
    assert doctor.format(words=2) in prompts and doctor.format(words=3) not in prompts  # its own prompts, its option given
    r = read_release(rel)
    assert r.manifest.task == "oneword" and r.manifest.prompt_set["name"] == "oneword-v1"
    assert r.manifest.roles["doctor"] == {**r.manifest.roles["doctor"], "model": "openai-api/toy/m", "service": "toy"}
    assert set(r.manifest.roles) == {"doctor", "patient"} and r.manifest.notes["options"] == {"words": 2}
    assert r.manifest.counts["cases"] == 3 and r.manifest.source["dataset_config"] == "all"
    answers = r.table("answers").to_pylist()  # its rows name no setting, format or image flag: the runner fills them in
    assert len(answers) == 6 and all(
        a["status"] == "ok" and (a["setting"], a["format"], a["with_image"]) == ("oneword", "text", False) for a in answers
    )

    # other processes: the task known by name through $CRAFTMD_TASKS; scored with its default scorer, then on the page
    env = dict(os.environ, CRAFTMD_TASKS=str(TASK_FILE))
    out = craftmd("score", rel, "--dataset", tiny_dataset, "--quiet", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["scored"] == ["oneword-words"]
    scores = read_release(rel).scores_with_records()[0].to_pylist()
    want = {a["case_id"]: len(a["response"].split()) for a in answers}
    assert {(s["case_id"], s["value"]) for s in scores} == set(want.items())
    out = craftmd(
        "analyse", "--releases", releases, "--dataset", tiny_dataset, "--out", site, "--page", "--resamples", "100", env=env
    )
    assert out.returncode == 0, out.stderr
    page = (site / "index.html").read_text()
    section = page[page.index('id="measures"') :]
    assert "<code>oneword_words</code>" in section and "words in the doctor&#39;s one-word diagnosis" in section.replace(
        "'", "&#39;"
    )
    # without the task file, the release's task is unknown: one line that says so
    no_tasks = {k: v for k, v in env.items() if k != "CRAFTMD_TASKS"}
    bare = craftmd("score", rel, "--dataset", tiny_dataset, "--quiet", env=no_tasks, ok=None)
    assert bare.returncode == 2 and "unknown task 'oneword'" in bare.stderr and bare.stderr.strip().count("\n") == 0


def test_a_broken_task_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad_task.py"
    bad.write_text("raise RuntimeError('no such thing')\n")
    none = tmp_path / "no_task.py"
    none.write_text("X = 1\n")
    for f, message in (
        (bad, "RuntimeError: no such thing"),
        (none, "defines no TASK"),
        (tmp_path / "missing.py", "does not exist"),
    ):
        rc = main(generate_argv(tmp_path, task=f, doctor="openai/x", base_url="http://127.0.0.1:9/v1", out=tmp_path / "r"))
        err = capsys.readouterr().err.strip()
        assert rc == 2 and message in err and err.count("\n") == 0


def test_a_task_file_lists_its_roles_and_options(capsys):
    with pytest.raises(SystemExit) as done:
        main(["generate", "--task", str(TASK_FILE), "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "task oneword: the patient says what brings them in" in out
    assert (
        "doctor" in out and "patient" in out and "words          int, default 3: the most words the doctor may answer with" in out
    )
    with pytest.raises(SystemExit):
        main(["generate", "--help", "--task", "encounters"])  # --task read first, wherever it stands
    out = capsys.readouterr().out
    assert "max_messages   int, default 50" in out and "closer" in out and "max_turns      int" not in out


P = ["--patient", "openai/x"]


@pytest.mark.parametrize(
    "bad, says",
    [
        ([*P, "-T", "words=0"], "task 'oneword': option words='0': Input should be greater than or equal to 1"),
        ([*P, "-T", "words=two"], "option words='two': Input should be a valid integer"),
        ([*P, "-T", "sentences=2"], "task 'oneword' has no option 'sentences'; its options: words"),
        ([*P, "-T", "words"], "-T 'words': expected NAME=VALUE"),
        ([*P, "--max-turns", "3"], "task 'oneword' has no option 'max_turns'"),  # an old per-task flag, of another task
        ([*P, "--role", "solver=openai/x"], "task 'oneword' has no role 'solver'; its roles: doctor, patient"),
        (
            ["-T", "words=2"],
            "the oneword task needs a patient (says what brings them in, from the case's vignette): --patient MODEL",
        ),
    ],
)
def test_a_bad_option_or_role_is_one_line_and_writes_nothing(tiny_dataset, tmp_path, capsys, bad, says):
    rel = tmp_path / "r"
    where = {"base_url": "http://127.0.0.1:9/v1", "out": rel}
    rc = main(generate_argv(tiny_dataset, *bad, task=TASK_FILE, doctor="openai/x", patient="", **where))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and says in err and err.count("\n") == 0, err
    assert not rel.exists()


def test_the_runner_counts_a_minimal_protocols_progress(tiny_dataset, tmp_path):
    """The toy's protocol calls no progress hook: the runner ticks after each job, so its bar counts every job."""
    from craftmd.generation.runner import GenerateSpec, runner

    with LoopbackServer(answer, models=("m",)) as server:
        run = runner(
            GenerateSpec(
                task=str(TASK_FILE),
                dataset=tiny_dataset,
                out=tmp_path / "r",
                doctor="openai/m",
                patient="openai/m",
                options={"words": "1"},
                base_url=server.base_url,
                cache=tmp_path / "c.sqlite",
                progress=False,
            )
        )
        report = run.run()
    assert run.done == 3 and report.answers == 3 and run.options.words == 1
