"""generation: run CRAFT-MD for a model and write a release (``craftmd generate``).

- ``models/``: one interface (``ChatModel``: ``chat``, ``chat_many``), one file per provider
  (``openai/<model>`` for any OpenAI-compatible server, ``vllm/<model>`` for vLLM's offline engine),
  ``get_model("provider/model")``.
- ``cache.py``: the SQLite request cache, the record of what every model said (never expires).
- ``calls.py``: ``Caller``: cache, bounded concurrency, capped retries with backoff and jitter, counters,
  batching for providers that batch.
- ``prompts/<set>/``: the versioned prompt files (verbatim upstream where recorded, reconstructed otherwise).
- ``protocol.py``: the doctor-patient conversation and the question messages of every setting and format.
- ``engine.py``: the experiments over a dataset, side by side under asyncio, into a release.
- ``ingest.py``: upstream's recorded results into releases.
"""
