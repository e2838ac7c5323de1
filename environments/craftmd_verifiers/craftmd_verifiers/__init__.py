"""CRAFT-MD's tasks as verifiers environments, driving the package's environment server (``craftmd.envs.serve``).

``vf-eval craftmd-verifiers`` evaluates (split ``test``); ``load_environment(task=..., split="train", **options)`` is what a
trainer loads. See the package's docs, "Training" -> "verifiers".
"""

from .taskset import CraftMDEnv, CraftMDTaskset, load_environment

__all__ = ["CraftMDTaskset", "CraftMDEnv", "load_environment"]
