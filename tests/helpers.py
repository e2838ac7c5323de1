"""Small helpers several test modules share (argv lists of the commands), so that each is written once."""

from __future__ import annotations


def generate_argv(
    dataset,
    *options,
    doctor: str = "openai/loopback",
    patient: str | None = None,
    solver: str | None = None,
    task: str | None = None,
    base_url=None,
    cache=None,
    out=None,
    quiet: bool = True,
) -> list[str]:
    """The argv of ``craftmd generate`` (no program name): the task where given, the dataset, the doctor and the patient (the
    doctor's model unless named; none where ``patient=""``), the solver, server, cache and output folder where given, then
    ``options`` as they are, and ``--quiet`` unless ``quiet=False``. Every item is a string (paths included)."""
    argv = ["generate", *(["--task", str(task)] if task else []), "--dataset", str(dataset), "--doctor", doctor]
    if patient != "":
        argv += ["--patient", patient or doctor]
    for flag, value in (("--solver", solver), ("--base-url", base_url), ("--cache", cache), ("--out", out)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + [str(o) for o in options] + (["--quiet"] if quiet else [])
