"""The commands that run across the rooms, together above them.

- :mod:`.cli`: the ``craftmd`` command (``craftmd.commands.cli:main``): one parser, each room's
  subcommands registered from its own ``cli.py``, the argument helpers every subcommand shares;
- :mod:`.pipeline`: ``craftmd leaderboard``, the main job (build, ingest, score, audits, analysis, page);
- :mod:`.submit`: scoring a submission file into a release and its report;
- :mod:`.ingest`: ``craftmd ingest``, upstream's recorded results into releases;
- :mod:`.audits`: the MELD and expert-review commands (scoring's MELD run, analysis's audits).

Nothing in the rooms or the shared ground imports these (``tests/test_imports.py``).
"""
