"""generation: the shared machinery that poses a task to models and writes a release (``craftmd generate``).

- ``runner.py``: the one runner (roles on their servers, the request cache, progress, estimates, the release);
  each task's protocol (``craftmd/tasks/<name>/protocol.py``) is a subclass of its ``Runner``.
- ``protocol.py``: prompt sets (``PromptSet``) and CRAFT-MD's doctor-patient conversation and question messages;
  ``questions.py``: what the protocols that ask questions after a conversation share.
- ``prompts/<set>/``: the dataset builder's prompt sets (``keyinfo-v1``, ``golden-v1``); a task's own sit in its folder.
- ``ingest.py``: upstream's recorded results into releases; ``shards.py``, ``context.py``: run splitting, context checks.
"""
