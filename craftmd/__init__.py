"""CRAFT-MD: conversational clinical reasoning benchmark for LLMs.

The code folders of the repository install under this namespace:
``craftmd.dataset_builder``, ``craftmd.generation``, ``craftmd.scoring``,
``craftmd.analysis`` and ``craftmd.cards``.
"""

__version__ = "0.1.0"


class CraftMDError(Exception):
    """An error the user can act on. The CLI prints it as one line, no traceback."""
