"""The inspect_ai entry point (pyproject.toml): importing it registers ``craftmd/craftmd`` and ``craftmd/consultation``."""

from .tasks import consultation, craftmd  # noqa: F401
