"""The inspect_ai entry point (pyproject.toml): importing it registers ``craftmd/craftmd`` and ``craftmd/consultation``, ``craftmd/encounters``."""

from .tasks import consultation, craftmd, encounters  # noqa: F401
