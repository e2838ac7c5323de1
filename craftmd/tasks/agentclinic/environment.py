"""The AgentClinic task as a training environment (:mod:`craftmd.envs`): :data:`ENVIRONMENT`. An episode is one
conversation (the doctor's messages, within its budget, are the policy's), rewarded by the moderator's verdict, as
``craftmd score --scorer agentclinic-moderator`` scores it. Its test split is the case set read in place from the pinned
source (``dataset=``: the folder that holds it); it has no training split.
"""

from __future__ import annotations

from pathlib import Path

from craftmd.envs.splits import Split
from craftmd.tasks.base import Environment


def osce_view(task, dataset: Path) -> Split:
    """The folder the runner reads the pinned source from (one line when it does not hold it)."""
    from .cases import locate

    locate(dataset)
    return Split(Path(dataset), None)


#: An episode is one OSCE conversation; the reward is the moderator's Yes (1) or No (0).
ENVIRONMENT = Environment(
    reward=(("agentclinic-moderator/correct", 1.0),),
    experiment="osce:conversation",
    test=osce_view,
    build="the pinned AgentClinic archive in {dataset} (../shared/sources)",
)

__all__ = ["ENVIRONMENT", "osce_view"]
