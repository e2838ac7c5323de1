"""Every ``craftmd`` subcommand, one module each, above the rooms.

- :mod:`.cli`: the ``craftmd`` command (``craftmd.commands.cli:run``, around ``main``): the list of subcommand modules
  (:data:`~.cli.COMMANDS`) and the argument helpers they share;
- one module per subcommand (:mod:`.build`, :mod:`.publish`, :mod:`.pin`, :mod:`.merge`,
  :mod:`.review`, :mod:`.finetune`, :mod:`.analyse`, :mod:`.ingest`, :mod:`.export`,
  :mod:`.leaderboard`, :mod:`.submit`, :mod:`.score`, :mod:`.validate`,
  :mod:`.grader_agreement`, :mod:`.meld`, :mod:`.judge`, :mod:`.judge_review`, :mod:`.judge_calibrate`,
  :mod:`.judge_sensitivity`, ...): its arguments and its handler, which calls the rooms' functions.
  The jobs that span rooms live here too: the main job (:func:`.leaderboard.leaderboard`), a submission scored
  and reported (:func:`.submit.score_submission`), upstream's results ingested (:func:`.ingest.ingest_source`);
- a task's own subcommands sit in its folder (``craftmd/tasks/<task>/commands.py``: ``craftmd keyinfo``, ``craftmd
  encounters``), in this layer too, found by :func:`.cli.task_commands`.

Nothing in the rooms, the shared ground, the task packages, the inspect bridge or the environments imports
these (``tests/test_imports.py``).
"""
