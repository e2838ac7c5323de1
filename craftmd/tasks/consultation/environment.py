"""The consultation task as a training environment (:mod:`craftmd.envs`): :data:`ENVIRONMENT`, and its training split, a view of the
dataset folder (:func:`train_view`).
"""

from __future__ import annotations

from pathlib import Path

from craftmd import CraftMDError
from craftmd.envs.splits import Split, new_view, train_source
from craftmd.tasks.base import Environment


def consultation_cases(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """``consult_train`` rows -> (one text case per training case, its keyinfo row), in the rows' order. A case's key-value
    items and initial request are its scripted dialogue's (else its first writer's)."""
    from craftmd.dataset_builder import craftmd_train as CT
    from craftmd.dataset_builder import golden as G
    from craftmd.dataset_builder.schema import text_row

    chosen: dict[str, dict] = {}
    for r in rows:
        if r["case"] not in chosen or (r["writer"] == G.WRITER_SCRIPT and chosen[r["case"]]["writer"] != G.WRITER_SCRIPT):
            chosen[r["case"]] = r
    cases, keyinfo = [], []
    for case, r in chosen.items():
        try:
            row = text_row(CT.sample(G.candidate(r)))
        except (KeyError, ValueError, TypeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise CraftMDError(f"consult_train: case {case} cannot be posed as a consultation case ({why})") from None
        if not r["items"] or not r["initial_request"]:
            raise CraftMDError(f"consult_train: case {case} has no key-value items or no initial request")
        cases.append(row)
        keyinfo.append(
            {
                "case_id": row["case_id"],
                "items": [{"key": i["key"], "value": i["value"]} for i in r["items"]],
                "initial_request": r["initial_request"],
                "status": "ok",
                "error": None,
                "model": f"consult_train:{r['writer']}",
                "prompt_sha256": None,
            }
        )
    return cases, keyinfo


def train_view(task, dataset: Path) -> Split:
    """The cases of ``consult_train`` (the golden consultations, split ``train``), one per case: its question, options and
    answer posed as a text case by the transforms ``craftmd_train`` uses (:func:`craftmd.dataset_builder.craftmd_train.sample`,
    ids ``train_mediq_<id>`` / ``train_medqa_<line>``) as the ``all`` config, and its key-value items and initial request
    (the scripted dialogue's, else the first writer's) as the ``keyinfo`` config."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from craftmd.dataset import config_file
    from craftmd.dataset_builder import golden as G
    from craftmd.dataset_builder.schema import TEXT_FEATURES
    from craftmd.keyinfo import CONFIG as KEYINFO, SCHEMA as KEYINFO_SCHEMA

    source = train_source(task, dataset, G.CONFIG)
    cases, keyinfo = consultation_cases(pq.read_table(source).to_pylist())
    G.check_disjoint(f"{source}", {r["case_id"]: r["vignette"] for r in cases}, G.benchmark_texts(dataset, task.name))
    view = new_view("consultation-train")
    root = Path(view.name)
    for config, rows, schema in (("all", cases, TEXT_FEATURES.arrow_schema), (KEYINFO, keyinfo, KEYINFO_SCHEMA)):
        path = config_file(root, config)
        path.parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return Split(root, "all", view, len(cases))


#: An episode is a whole consultation, then the solver's free response, rewarded by the grader's ``correct``. Its
#: training dialogues (the golden consultations, ``consult_train``) carry the doctor prompt of ``consult-v1``.
ENVIRONMENT = Environment(
    experiment="consult_100:frq",
    reward=(("{grader}/correct", 1.0),),
    config="all",
    train=train_view,
    train_config="consult_train",
    train_prompt=Path(__file__).parent / "prompts" / "consult-v1" / "doctor_system.txt",
)

__all__ = ["ENVIRONMENT", "train_view", "consultation_cases"]
