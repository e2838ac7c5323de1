"""The inspect_ai entry point (pyproject.toml): importing it registers ``craftmd/<task>`` for every built-in task (one
factory, :func:`.tasks.inspect_task`; ``craftmd/craftmd``, ``craftmd/consultation``, ``craftmd/encounters``), and the hook
that lets a local service go without a key (:mod:`craftmd.inspect_bridge.keys`)."""

from .keys import LocalKeys  # noqa: F401
from .tasks import register_builtin

TASKS = register_builtin()
