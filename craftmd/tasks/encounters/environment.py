"""MedPI's patient-led encounters as a training environment (:mod:`craftmd.envs`): :data:`ENVIRONMENT`, and its training split, a view of the
dataset folder (:func:`train_view`).
"""

from __future__ import annotations

from pathlib import Path

from craftmd.envs.splits import Split, link, new_view, train_source
from craftmd.tasks.base import Environment


def train_view(task, dataset: Path) -> Split:
    """The training packets (``craftmd encounters build --split train``, checked against the benchmark's packets by the
    build, its report says so) as the ``packets`` config."""
    from craftmd.dataset_builder.packets import load_packets

    source = train_source(task, dataset, "packets")
    packets = load_packets(dataset, split="train")  # a malformed file: one line
    view = new_view("encounters-train")
    link(Path(view.name), "packets", source)
    return Split(Path(view.name), None, view, len(packets))


#: An episode is one encounter, rewarded by the rubric judge (``judge=``) on the dimensions that apply to its objective.
ENVIRONMENT = Environment(
    reward=(("judge/rubric_score", 1.0),),
    judged=True,
    train=train_view,
    train_config="packets",
    build="craftmd encounters build --out {dataset}{train}",
)

__all__ = ["ENVIRONMENT", "train_view"]
