"""The commands that run across the rooms, together above them.

- :mod:`.cli`: the ``craftmd`` command (``craftmd.commands.cli:main``): one parser, each room's
  subcommands registered from its own ``cli.py``, the argument helpers every subcommand shares;
- :mod:`.pipeline`: ``craftmd leaderboard``, the main job (build, ingest, score, audits, analysis, page);
- :mod:`.submit`: scoring a submission file into a release and its report;
- :mod:`.ingest`: ``craftmd ingest``, upstream's recorded results into releases;
- :mod:`.audits`: the expert-review commands;
- :mod:`.score`, :mod:`.validate`, :mod:`.grader_agreement`, :mod:`.meld`, :mod:`.judge`, :mod:`.judge_review`,
  :mod:`.judge_calibrate`, :mod:`.judge_sensitivity`: the scoring commands, one module each.

Nothing in the rooms or the shared ground imports these (``tests/test_imports.py``).
"""
