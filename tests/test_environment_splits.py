"""The training splits as environments (issue #35): consultation on `consult_train`'s cases and CRAFT-MD on
`craftmd_train`, posed by the task's own runner and scored by its own scorers from a view of the dataset folder;
each refuses a training case that is a benchmark case, by id or by text (planted duplicates)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import sim_episodes  # noqa: E402
from loopback import LoopbackServer, text_of  # noqa: E402
from test_environments import weighted  # noqa: E402

from craftmd import CraftMDError  # noqa: E402
from craftmd.commands.cli import main as cli_main  # noqa: E402
from craftmd.dataset_builder import craftmd_train as CT  # noqa: E402
from craftmd.dataset_builder import golden as G  # noqa: E402
from craftmd.envs.core import episodes  # noqa: E402
from craftmd.release import read_release  # noqa: E402

REPLAY = {"n": 2, "seed": 3, "max_messages": 12}
#: Two MedQA-format training items that are no benchmark case.
ITEMS = [
    ("A 34-year-old man comes to the physician because of a painless swelling of the left testis for two months. He has no "
     "urinary symptoms. His father had colon cancer. He smokes cigarettes. Examination shows a firm mass that does not "
     "transilluminate. Serum alpha-fetoprotein concentration is increased. Which of the following is the most likely diagnosis?",
     ["Seminoma", "Yolk sac tumor", "Hydrocele", "Varicocele"], 1),
    ("A 25-year-old woman comes to the physician because of fatigue and joint pain for three months. She has a facial rash "
     "that worsens in sunlight. Her mother has hypothyroidism. She takes no medications. Examination shows a rash over both "
     "cheeks and swelling of both wrists. Serum antinuclear antibody titer is 1:640. Which of the following is the most "
     "likely diagnosis?", ["Systemic lupus erythematosus", "Rheumatoid arthritis", "Dermatomyositis", "Psoriatic arthritis"], 0),
]  # fmt: skip
PATIENT, SOLVER = "openai-api/sim/patient", "openai-api/sim/solver"


def write_train_configs(root: Path, items: list, benchmark: dict[str, str]) -> None:
    """consult_train and craftmd_train of ``items`` (a MedQA-format file), by the build's own functions."""
    import json

    from craftmd.dataset_builder.build import write_config
    from craftmd.dataset_builder.medqa import read_jsonl

    f = root / "medqa_train.jsonl"
    lines = [{"question": q, "options": dict(zip("ABCD", o)), "answer": o[a], "answer_idx": "ABCD"[a]} for q, o, a in items]
    f.write_text("".join(json.dumps(line) + "\n" for line in lines))
    medqa = read_jsonl(f)
    consult, _ = G.build_rows(b"", medqa, benchmark)
    craft, _ = CT.build_rows(G.medqa_candidates(medqa), benchmark)
    assert len(consult) == len(craft) == len(items)
    write_config(root, G.CONFIG, consult, split="train")
    write_config(root, CT.CONFIG, craft, split="train")
    f.unlink()


@pytest.fixture(scope="module")
def data(upstream, tmp_path_factory):
    """Two recorded benchmark cases (the test split) and the two training items (the train configs)."""
    from loopback import write_replay_dataset

    out = write_replay_dataset(upstream, tmp_path_factory.mktemp("splits") / "data")
    f = out / "all" / "test-00000-of-00001.parquet"
    pl.read_parquet(f).with_columns(paper_answer=pl.col("answer").str.to_lowercase()).write_parquet(f)
    write_train_configs(out, ITEMS, G.benchmark_texts(out))
    return out


def answers(dataset: Path) -> dict[str, str]:
    df = pl.read_parquet(dataset / "all" / "test-00000-of-00001.parquet")
    return dict(zip(df["case_id"], df["answer"]))


def test_consultation_on_consult_train_cases_and_craftmd_score_agrees(data, tmp_path, monkeypatch):
    """The consultation's train split poses consult_train's cases: the patient opens with the golden build's initial
    request and holds the vignette; the solver answers the item's question; reward = 1.0 × accuracy + 0.5 × doctor-key
    recall (the golden build's key-value items), and `craftmd score` of the release with the view gives it back."""
    rows = pl.read_parquet(data / G.CONFIG / "train-00000-of-00001.parquet").to_dicts()
    weights = {"offline/correct": 1.0, "keyinfo/doctor_key_recall": 0.5}

    def respond(request: dict) -> str:
        if request["model"] == "solver":
            seen = text_of(request["messages"][-1]["content"])
            return state["answer"] if "What medications are you taking?" in seen else "sunburn"
        return "I smoke and my father had cancer."

    state = {}
    with LoopbackServer(respond, models=("patient", "solver")) as server:
        options = {"patient": PATIENT, "solver": SOLVER, "reward_weights": weights}
        env = sim_episodes(monkeypatch, server, "consultation", "train", data, tmp_path, **options)
        assert [env.case_id(i) for i in range(len(env))] == ["train_medqa_1", "train_medqa_2"]
        truth = answers(env.dataset)  # the view: the training cases where the benchmark's stand
        assert truth == {"train_medqa_1": "Yolk sac tumor", "train_medqa_2": "Systemic lupus erythematosus"}

        async def play() -> list:
            out = []
            for i, question in ((0, "What medications are you taking?"), (1, "Where do you live?")):
                state["answer"] = truth[env.case_id(i)]
                s = await env.reset(i)
                assert s.messages[-1] == {"role": "user", "content": rows[i]["initial_request"]}  # the golden build's request
                s = await env.step(question)
                assert not s.done
                s = await env.step("Thank you, that is all.")
                assert s.done
                out.append((env.case_id(i), s.reward, s.info["scores"]))
            await env.aclose()
            return out

        got = asyncio.run(play())
    assert got[0][2]["offline/correct"] == [1.0] and got[1][2]["offline/correct"] == [0.0]
    keyinfo = {r["case_id"]: r for r in pq.read_table(env.dataset / "keyinfo" / "test-00000-of-00001.parquet").to_pylist()}
    assert [{"key": i["key"], "value": i["value"]} for i in keyinfo["train_medqa_1"]["items"]] == rows[0]["items"]
    rel = env.write_release(tmp_path / "rollouts")
    assert read_release(rel).manifest.notes["environment"].endswith("under training, its replies given to step()")
    assert (
        cli_main(["score", str(rel), "--dataset", str(env.dataset), "--scorer", "offline", "--scorer", "keyinfo", "--quiet"]) == 0
    )
    scores = read_release(rel).table("scores").to_pylist()
    for case, reward, _ in got:
        assert weighted(scores, case, weights).hex() == reward.hex()


def test_craftmd_on_craftmd_train_and_craftmd_score_agrees(data, tmp_path, monkeypatch):
    truth = dict(zip(*pl.read_parquet(data / CT.CONFIG / "train-00000-of-00001.parquet", columns=["case_id", "answer"])))
    with LoopbackServer(lambda request: "I have a painless lump.", models=("patient",)) as server:
        monkeypatch.setenv("SIM_BASE_URL", server.base_url)
        env = episodes("craftmd", "train", dataset=data, patient=PATIENT, cache=tmp_path / "c.sqlite")

        async def play() -> list:
            out = []
            for i, right in ((0, True), (1, False)):
                case = env.case_id(i)
                await env.reset(i)
                await env.step("Final Diagnosis: ?")
                s = await env.step(truth[case] if right else "sunburn")
                out.append((case, s.reward))
            await env.aclose()
            return out

        got = asyncio.run(play())
    assert got == [("train_medqa_1", 1.0), ("train_medqa_2", 0.0)]
    rel = env.write_release(tmp_path / "rollouts")
    assert cli_main(["score", str(rel), "--dataset", str(env.dataset), "--scorer", "offline", "--quiet"]) == 0
    back = {r["case_id"]: r["value"] for r in read_release(rel).table("scores").to_pylist() if r["scorer"] == "offline"}
    assert {c: back[c].hex() for c, _ in got} == {c: r.hex() for c, r in got}


def plant(data: Path, out: Path, config: str, **change) -> Path:
    """A copy of ``data`` whose ``config`` (split train) has its first row changed (a training file made elsewhere)."""
    shutil.copytree(data, out)
    f = out / config / "train-00000-of-00001.parquet"
    t = pq.read_table(f)
    rows = t.to_pylist()
    rows[0].update(change)
    pq.write_table(pa.Table.from_pylist(rows, t.schema), f)
    return out


@pytest.mark.parametrize("task,config,field", [("consultation", G.CONFIG, "vignette"), ("craftmd", CT.CONFIG, "vignette")])
def test_a_planted_benchmark_case_is_refused(data, tmp_path, monkeypatch, task, config, field):
    """A training row whose vignette is a benchmark case's (verbatim, then lightly reworded) is refused in one line naming
    it and the case; a training id that is a benchmark id too."""
    from craftmd.envs import load_environment

    monkeypatch.setenv("SIM_BASE_URL", "http://127.0.0.1:9")
    bench = pl.read_parquet(data / "all" / "test-00000-of-00001.parquet").row(0, named=True)
    roles = {"patient": PATIENT, "solver": SOLVER}
    assert len(episodes(task, "train", dataset=data, **roles)) == 2  # the clean split loads
    reworded = bench["vignette"].replace(" and ", " & ", 2).replace("year-old", "yr-old", 1)
    for n, text in enumerate((bench["vignette"], reworded)):
        planted = plant(data, tmp_path / f"{n}", config, **{field: text})
        with pytest.raises(CraftMDError) as e:
            load_environment(task, "train", dataset=planted, **roles)
        msg = str(e.value)
        assert "\n" not in msg and "are benchmark cases by text, first train_medqa_1 ~ " + bench["case_id"] in msg, msg
    if task == "craftmd":
        planted = plant(data, tmp_path / "id", config, case_id=bench["case_id"])
        with pytest.raises(CraftMDError, match=f"training id\\(s\\) {bench['case_id']} are benchmark ids"):
            load_environment(task, "train", dataset=planted, **roles)


def test_the_built_training_configs_are_disjoint_and_every_consult_case_is_posed(dataset_dir):
    """On the real build: every consult_train case is posed (one per case, the script's items), craftmd_train's and the
    consultation's training cases pass the benchmark check, and the two splits pose the same MedQA items alike."""
    from craftmd.envs.splits import open_split

    consult = pq.read_table(dataset_dir / G.CONFIG / "train-00000-of-00001.parquet").to_pylist()
    c = open_split("consultation", "train", dataset_dir)
    k = open_split("craftmd", "train", dataset_dir)
    assert c.cases == len({r["case"] for r in consult}) > 100
    posed = pq.read_table(c.dataset / "all" / "test-00000-of-00001.parquet").to_pylist()
    craft = {r["case_id"]: r for r in pq.read_table(k.dataset / "all" / "test-00000-of-00001.parquet").to_pylist()}
    assert k.cases == len(craft) and not {r["case_id"] for r in posed} & set(G.benchmark_texts(dataset_dir))
    same = [r for r in posed if r["case_id"] in craft]
    assert len(same) > 100 and all(r == craft[r["case_id"]] for r in same)


def test_a_train_split_not_built_is_one_line(data, tmp_path, monkeypatch):
    from craftmd.envs import load_environment

    monkeypatch.setenv("SIM_BASE_URL", "http://127.0.0.1:9")
    bare = tmp_path / "bare"
    shutil.copytree(data, bare, ignore=shutil.ignore_patterns("*_train"))
    for task in ("craftmd", "consultation"):
        line = f"split 'train' of {task} \\(config \\w+_train\\) is not built in .*: run craftmd build"
        with pytest.raises(CraftMDError, match=line):
            load_environment(task, "train", dataset=bare, patient=PATIENT, solver=SOLVER)
