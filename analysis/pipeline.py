"""Deprecated name of :mod:`craftmd.analysis.tables`, kept only until every caller imports from there.

The main job (build, ingest, grade, then this analysis) moved to :mod:`craftmd.pipeline`.
"""

from .tables import Analysis, analyse, compute, read_audits, write_tables  # noqa: F401
