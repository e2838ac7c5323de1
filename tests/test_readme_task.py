"""The documentation's "Write a task" example runs as printed (issue #31): its files are taken from the page's text
(``docs/write-a-task.md``) and
written to a fresh folder, and its commands (``craftmd generate --task … -T …``, ``craftmd score``, ``craftmd analyse
--page``, ``inspect eval``) run there against a loopback model server, each in its own process as a user runs them.
The example is the toy task of ``tests/fixtures/oneword/``, byte for byte, so the two cannot drift apart."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from craftmd.release import SCORES_FILE

sys.path.insert(0, str(Path(__file__).parent))
from loopback import LoopbackServer  # noqa: E402
from test_toy_protocol import answer, tiny_dataset  # noqa: E402, F401  (the same three cases, the same loopback replies)

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "oneword"
MODEL = "openai-api/toy/m"


def section() -> str:
    """The page "Write a task" of the documentation, whole."""
    return (ROOT / "docs" / "write-a-task.md").read_text()


def files(text: str) -> dict[str, str]:
    """Each file the section prints: a line naming it in backticks and a colon, then its fenced block."""
    return {m[1]: m[2] for m in re.finditer(r"^`([\w./-]+)`:\n\n```\w*\n(.*?)^```", text, re.M | re.S)}


def commands(text: str) -> list[list[str]]:
    """The lines of the section's bash blocks, in order, as argument lists (comments dropped)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)
    return [shlex.split(line, comments=True) for block in blocks for line in block.splitlines() if line.strip()]


def localised(args: list[str], data: Path, root: Path) -> list[str]:
    """A README command for this test: its models on the loopback server, its folders under ``root``."""
    swap = {"openai/my-model": MODEL, "openai/gpt-4o": MODEL}
    out = []
    for a in args:
        a = swap.get(a, a).replace("patient=openai/gpt-4o", f"patient={MODEL}")
        a = (
            a.replace("out/data", str(data))
            .replace("out/releases", str(root / "releases"))
            .replace("out/page", str(root / "page"))
        )
        out.append(a)
    return out


def run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    tool = (
        [sys.executable, "-m", "craftmd.commands.cli"] if args[0] == "craftmd" else [str(Path(sys.executable).with_name(args[0]))]
    )
    return subprocess.run([*tool, *args[1:]], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_readme_example_is_the_toy_task():
    printed = files(section())
    assert printed["oneword/oneword.py"] == (FIXTURE / "oneword.py").read_text()
    assert len(printed["oneword/oneword.py"].splitlines()) <= 80  # a task of one's own is short: the rest is the package's
    prompts = {p.name: p.read_text() for p in (FIXTURE / "prompts" / "oneword-v1").iterdir()}
    assert {k.rsplit("/", 1)[1]: v for k, v in printed.items() if k.endswith(".txt")} == prompts


@pytest.fixture
def written(tmp_path) -> Path:
    """The section's files, written under a fresh folder as printed."""
    for name, body in files(section()).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    return tmp_path


def test_the_readme_task_generates_scores_and_shows_as_printed(written, tiny_dataset, monkeypatch):  # noqa: F811
    steps = [c for c in commands(section()) if c[0] != "inspect"]
    assert [c[:2] for c in steps] == [
        ["craftmd", "generate"],
        ["export", "CRAFTMD_TASKS=oneword/oneword.py"],
        ["craftmd", "score"],
        ["craftmd", "analyse"],
    ]
    assert "-T" in steps[0] and "--page" in steps[3]
    env = {k: v for k, v in os.environ.items() if k != "CRAFTMD_TASKS"}
    env["CRAFTMD_CACHE"] = str(written / "cache")  # the request cache the README's commands use by default: a fresh one
    with LoopbackServer(answer, models=("m",)) as server:
        env["TOY_BASE_URL"] = server.base_url
        outs = []
        for args in steps:
            if args[0] == "export":
                key, _, value = args[1].partition("=")
                env[key] = value
                continue
            args = localised(args, tiny_dataset, written)
            if args[1] == "analyse":
                args += ["--resamples", "100"]  # the page's intervals: fewer resamples than the default, for the test's time
            out = run(args, env, written)
            assert out.returncode == 0, f"{args}: {out.stderr[-2000:]}"
            outs.append(out)
        assert server.calls == 12  # three cases, two trials: the patient's complaint and the doctor's diagnosis each
        doctor = (written / "oneword" / "prompts" / "oneword-v1" / "doctor.txt").read_text()
        assert doctor.format(words=2) in {r["messages"][0]["content"] for r in server.log}  # -T words=2 reached the prompt
    rel = written / "releases" / "oneword-my-model"  # read as files: this process never ran the task file
    manifest = json.loads((rel / "manifest.json").read_text())
    assert manifest["task"] == "oneword" and manifest["notes"]["options"] == {"words": 2}
    answers = pq.read_table(rel / "answers.parquet").to_pylist()
    assert len(answers) == 6 and all(a["status"] == "ok" for a in answers)
    assert json.loads(outs[1].stdout.strip().splitlines()[-1])["scored"] == ["oneword-words"]
    scores = pq.read_table(rel / SCORES_FILE).to_pylist()
    assert sorted((s["case_id"], s["trial"], s["value"]) for s in scores) == sorted(
        (a["case_id"], a["trial"], len(a["response"].split())) for a in answers
    )
    page = (written / "page" / "index.html").read_text()
    assert "<code>oneword_words</code>" in page[page.index('id="measures"') :]


def test_the_readme_task_runs_under_inspect_eval(written, tiny_dataset):  # noqa: F811
    """The README's ``inspect eval`` of the task file, as printed (its ``@task`` function at the end)."""
    task_file = written / "oneword" / "oneword.py"
    (step,) = [c for c in commands(section()) if c[0] == "inspect"]
    env = dict(os.environ, CRAFTMD_TASKS=str(task_file), CRAFTMD_CACHE=str(written / "cache"))
    with LoopbackServer(answer, models=("m",)) as server:
        env["TOY_BASE_URL"] = server.base_url
        env.pop("TOY_API_KEY", None)
        args = localised(step, tiny_dataset, written) + [
            "--display",
            "plain",
            "--log-format",
            "eval",
            "--log-dir",
            str(written / "logs"),
        ]
        out = run(args, env, written)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert server.calls == 6  # three cases, one epoch: the patient and the doctor each
    from inspect_ai.log import read_eval_log

    (log,) = sorted((written / "logs").glob("*.eval"))
    got = read_eval_log(str(log))
    assert got.status == "success" and len(got.samples) == 3
