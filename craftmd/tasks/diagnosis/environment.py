"""CRAFT-MD's diagnosis task as a training environment (:mod:`craftmd.envs`): :data:`ENVIRONMENT`, and its training split, a view of the
dataset folder (:func:`train_view`).
"""

from __future__ import annotations

from pathlib import Path

from craftmd.envs.splits import Split, link, new_view, train_source
from craftmd.tasks.base import Environment


def train_view(task, dataset: Path) -> Split:
    """The ``craftmd_train`` config (MedQA items posed as CRAFT-MD vignettes, split ``train``) as the ``all`` config."""
    import pyarrow.parquet as pq

    from craftmd.dataset_builder import craftmd_train as CT
    from craftmd.dataset_builder import golden as G

    source = train_source(task, dataset, CT.CONFIG)
    rows = pq.read_table(source, columns=["case_id", "vignette"]).to_pylist()
    G.check_disjoint(f"{source}", {r["case_id"]: r["vignette"] or "" for r in rows}, G.benchmark_texts(dataset, task.name))
    view = new_view("craftmd-train")
    link(Path(view.name), "all", source)
    return Split(Path(view.name), "all", view, len(rows))


#: An episode is a multi-turn interview answered in free response, rewarded by the grader's ``correct``.
ENVIRONMENT = Environment(
    experiment="multiturn:frq", reward=(("{grader}/correct", 1.0),), config="all", train=train_view, train_config="craftmd_train"
)

__all__ = ["ENVIRONMENT", "train_view"]
