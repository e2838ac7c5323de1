"""craftmd inside the inspect_ai ecosystem (``pip install craftmd[inspect]``).

* :mod:`.tasks`: the package's tasks for ``inspect eval`` (``craftmd/craftmd``,
  ``craftmd/consultation``, ``craftmd/encounters``), registered by the ``inspect_ai`` entry point in pyproject.toml.
  The solver runs the package's own protocol (prompt set, turn-taking, question building:
  :mod:`craftmd.generation`) with inspect's models as its agents (the model under test is the
  doctor; ``--model-role patient=…``, ``summarizer=…``, ``solver=…``, ``grader=…``), and the
  scorers are the package's (MCQ rules, the offline grader, the LLM grader as role ``grader``,
  the history metrics). Each sample's store keeps the release rows it produced, each score
  the score rows, so a log turns into a release with nothing recomputed.
* :mod:`.logs`: ``craftmd ingest --inspect LOG…`` (logs → a release) and ``craftmd export
  RELEASE --inspect DIR`` (a release → one log per setting and format, for ``inspect view``).

inspect_ai is imported only here, and only when one of these is used.
"""

#: Where a sample's store keeps the release rows it produced, and a score's metadata its score rows.
STORE_KEY = "craftmd"
#: The package's tasks as inspect names them (``inspect eval craftmd/craftmd``).
TASKS = ("craftmd/craftmd", "craftmd/consultation", "craftmd/encounters")


def require_inspect():
    """inspect_ai, or one line saying how to install it."""
    from craftmd import CraftMDError

    try:
        import inspect_ai
    except ImportError:
        raise CraftMDError("inspect-ai is not installed: pip install 'craftmd[inspect]'") from None
    return inspect_ai
