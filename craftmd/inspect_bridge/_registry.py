"""The inspect_ai entry point (pyproject.toml): importing it registers ``craftmd/craftmd``, ``craftmd/consultation`` and
``craftmd/encounters``, and the hook that lets a local service go without a key (:mod:`craftmd.inspect_bridge.keys`)."""

from .keys import LocalKeys  # noqa: F401
from .tasks import consultation, craftmd, encounters  # noqa: F401
