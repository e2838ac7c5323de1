"""``craftmd generate``: run a task's protocol for a model and write a release.

The options every task shares are here; a task's own are derived from it: its roles (``--role NAME=MODEL``,
``--doctor``/``--patient`` for those two) and its options class (``-T KEY=VALUE``), and ``craftmd generate --task
NAME --help`` lists them. The flags of the old per-task options stay as hidden aliases of ``--role``/``-T``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from craftmd import CraftMDError
from craftmd.commands.cli import (
    add_call_arguments,
    add_cases_argument,
    add_dataset_argument,
    add_list_argument,
    add_quiet_argument,
    check_base_url,
    command,
    price_type,
    trials_type,
    usd_type,
)
from craftmd.commands.serving import add_serve_arguments
from craftmd.generation.shards import add_shard_argument
from craftmd.release import MAX_TRIALS
from craftmd.tasks import BUILTIN, DEFAULT, Task, get_task

#: The old per-task flags, kept as hidden aliases: flag -> (``roles`` or ``options``, the key, the value a switch gives).
ALIASES = {
    "--summarizer": ("roles", "summarizer", None),
    "--solver": ("roles", "solver", None),
    "--closer": ("roles", "closer", None),
    "--max-turns": ("options", "max_turns", None),
    "--max-messages": ("options", "max_messages", None),
    "--no-memory-tags": ("options", "memory_tags", "false"),
    "--memory-tag-tokens": ("options", "tag_max_tokens", None),
    "--embedder": ("options", "embedder", None),
}


class _Price(argparse.Action):
    """``--price IN,OUT`` (every role) or ``--price ROLE=IN,OUT`` (one role), repeatable."""

    def __call__(self, parser, namespace, values, option_string=None):
        prices = dict(getattr(namespace, self.dest, None) or {})
        role, eq, pair = values.rpartition("=")
        try:
            prices[role.strip() if eq else "*"] = price_type(pair)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"{option_string} {values!r}: {exc}")
        setattr(namespace, self.dest, prices)


class _EngineArg(argparse.Action):
    """``--engine-arg KEY=VALUE`` (every vllm/ role) or ``--engine-arg ROLE.KEY=VALUE`` (one role), repeatable."""

    def __call__(self, parser, namespace, values, option_string=None):
        from craftmd.models.vllm import engine_value

        given = {k: dict(v) for k, v in (getattr(namespace, self.dest, None) or {}).items()}
        target, eq, text = values.partition("=")
        role, dot, key = target.strip().rpartition(".")
        if not eq or not key:
            parser.error(f"{option_string} {values!r}: expected [ROLE.]KEY=VALUE, e.g. patient.max_model_len=8192")
        try:
            given.setdefault(role if dot else "*", {})[key] = engine_value(key, text.strip())
        except CraftMDError as exc:
            parser.error(f"{option_string} {values!r}: {exc}")
        setattr(namespace, self.dest, given)


class _Alias(argparse.Action):
    """An old per-task flag: ``--solver M`` is ``--role solver=M``, ``--max-turns N`` is ``-T max_turns=N``."""

    def __init__(self, option_strings, dest, key: str, value: str | None = None, **kwargs):
        self.key, self.value = key, value
        super().__init__(option_strings, dest, nargs=0 if value is not None else None, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        given = list(getattr(namespace, self.dest, None) or [])
        setattr(namespace, self.dest, [*given, f"{self.key}={self.value if self.value is not None else values}"])


class _GenerateParser(argparse.ArgumentParser):
    """The ``generate`` parser: it reads ``--task`` first, so that its ``--help`` lists that task's roles and options."""

    task_name = DEFAULT

    def parse_known_args(self, args=None, namespace=None):
        first = argparse.ArgumentParser(add_help=False)
        first.add_argument("--task", default=DEFAULT)
        self.task_name = first.parse_known_args(args)[0].task
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        try:
            about = task_help(get_task(self.task_name))
        except CraftMDError as exc:
            about = f"task {self.task_name}: {exc}"
        return super().format_help() + "\n" + about + "\n"


def register(sub) -> None:
    """Add ``craftmd generate`` to the ``craftmd`` parser."""
    p = command(sub, "generate", run_generate)
    p.__class__ = _GenerateParser  # argparse makes every subparser of one class: this one reads --task first
    _task_arguments(p)
    add_dataset_argument(p)
    p.add_argument(
        "--config", default="all", help="dataset config to draw cases from (default: all; nejm_image for the image cases)"
    )
    add_cases_argument(p, "only these case ids (of --config; packet ids for encounters)")
    p.add_argument(
        "--trials",
        type=trials_type,
        default=1,
        help=f"trials per case, 1 to {MAX_TRIALS} (the paper ran 5); trial t samples with seed S+t",
    )
    add_list_argument(
        p,
        "--experiments",
        "LIST",
        "settings and/or formats to run, comma-separated (default all; --task NAME --help lists the task's)",
    )
    add_call_arguments(p)
    _run_arguments(p)
    add_serve_arguments(
        p,
        "the task's (doctor, patient, and those --task NAME --help lists)",
        "RELEASE_DIR.servers/ (the run record lists them)",
    )
    add_shard_argument(p)
    p.add_argument("--out", required=True, type=Path, metavar="RELEASE_DIR", help="the release folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace RELEASE_DIR if it exists")
    add_quiet_argument(p)
    for flag, (dest, key, value) in ALIASES.items():
        p.add_argument(flag, dest=dest, action=_Alias, key=key, value=value)


def _task_arguments(p: argparse.ArgumentParser) -> None:
    """``--task``, its roles (``--doctor``, ``--patient``, ``--role``) and its options (``-T``)."""
    p.add_argument(
        "--task",
        default=DEFAULT,
        metavar="TASK",
        help=f"the task whose protocol runs: a built-in task ({', '.join(BUILTIN)}; default {DEFAULT}), or a task file of "
        "your own (path/to/my_task.py: its TASK, protocol and prompts; $CRAFTMD_TASKS lists such files for every "
        "command). --task NAME --help lists its roles, options and what it needs (its dataset, its models)",
    )
    p.add_argument("--doctor", metavar="MODEL", help="the model under test (the role doctor), e.g. openai-api/local/my-model")
    p.add_argument(
        "--patient", metavar="MODEL", help="the patient-AI (the role patient), e.g. openai/gpt-4o, for the tasks that have one"
    )
    p.add_argument(
        "--role",
        dest="roles",
        action="append",
        metavar="NAME=MODEL",
        help="bind one of the task's roles to a model (e.g. --role solver=openai/gpt-4o); repeatable",
    )
    p.add_argument(
        "-T",
        "--option",
        dest="options",
        action="append",
        metavar="KEY=VALUE",
        help="one of the task's options (e.g. -T max_turns=20); repeatable",
    )
    p.add_argument(
        "--prompt-set",
        default=None,
        help="a prompt set of the task (a folder of its prompts/; default: the task's own: craftmd-upstream-3bb2737, consult-v1, medpi-v1)",
    )


def _run_arguments(p: argparse.ArgumentParser) -> None:
    """How the run calls its models and what it may cost."""
    p.add_argument(
        "--engine-arg",
        dest="engine_args",
        action=_EngineArg,
        default={},
        metavar="[ROLE.]KEY=VALUE",
        help="a vllm/ engine setting (tensor_parallel_size, gpu_memory_utilization, max_model_len, dtype) for every "
        "vllm/ role, or ROLE.KEY=VALUE for one role's engine; repeatable, recorded in the run record. Roles on one "
        "model share one engine; engines on distinct models share the GPU: each without its own "
        "gpu_memory_utilization gets an equal share of what 0.9 leaves after those given",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes sharing the work (default 1); more help against a fast local server, where the "
        "client's own CPU per request is the limit (ignored for vllm/ models, which batch, and for encounters)",
    )
    p.add_argument(
        "--price",
        action=_Price,
        metavar="[ROLE=]IN,OUT",
        help="USD per million input,output tokens, for the cost in the bar, the summary and --estimate; ROLE=IN,OUT "
        "prices one role (e.g. --price patient=2.5,10 for an API patient beside a local doctor)",
    )
    p.add_argument(
        "--budget",
        type=usd_type,
        metavar="USD",
        help="stop starting new conversations once the run's cost (at --price) reaches USD; what was not run is "
        "recorded as not run in the run record",
    )
    p.add_argument(
        "--estimate", action="store_true", help="print each role's expected calls, tokens and cost for the run, and send nothing"
    )


def serve_plan(args, spec):
    """The local models of the run (:func:`craftmd.commands.serving.plan`, nothing started) and the spec that calls
    them by the names their servers will answer to; (None, spec) when the run serves none."""
    from dataclasses import replace

    from craftmd.commands.serving import concurrency, logs_folder, plan

    given = {"doctor": spec.doctor, **({"patient": spec.patient} if spec.patient else {}), **spec.roles}
    bound = get_task(spec.task).bind_roles(given)
    served, names = plan(args, bound, logs_folder(spec.out))
    if served is None:
        return None, spec
    roles = {r: names[r] for r in bound if r not in ("doctor", "patient") and (r in spec.roles or r in served.names)}
    spec = replace(
        spec,
        doctor=names["doctor"],
        patient=names.get("patient") if spec.patient else None,
        roles=roles,
        served=served.describe(),
        server_concurrency=concurrency(served, spec.server_concurrency),
    )
    return served, spec


def pairs(given: list[str] | None, what: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}`` (a key given again: the later value, as for any flag); a pair without
    ``=`` is one line (``what``: the flag)."""
    out: dict[str, str] = {}
    for item in given or []:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CraftMDError(f"{what} {item!r}: expected NAME=VALUE")
        out[key] = value
    return out


def task_help(task: Task) -> str:
    """The roles and options of ``task``, as ``--help`` lists them."""
    lines = [f"task {task.name}: {task.description}", "", "roles (--role NAME=MODEL; --doctor, --patient for those two):"]
    for r in task.roles:
        how = f"default: the {r.default}'s model" if r.default else "required" if r.required else "optional"
        lines.append(f"  {r.name:<14} {r.help} ({how})")
    fields = task.options.model_fields
    lines += ["", "options (-T KEY=VALUE):" if fields else "options: none"]
    for name, f in fields.items():
        kind = getattr(f.annotation, "__name__", str(f.annotation))
        default = f.get_default(call_default_factory=True)
        lines.append(f"  {name:<14} {kind}, default {default!r}: {f.description or ''}".rstrip(": "))
    if task.settings:
        lines += ["", f"experiments (--experiments): settings {', '.join(task.settings)}; formats {', '.join(task.formats)}"]
    return "\n".join(lines)


def run_generate(args) -> int:
    """run a task's protocol for a model and write a release

    One runner for every task (--task craftmd, consultation, encounters, or a task file): each role is a model bound to
    its own server — openai-api/<service>/<model> reads <SERVICE>_BASE_URL and <SERVICE>_API_KEY; openai/<model> uses
    --base-url or OPENAI_BASE_URL and OPENAI_API_KEY; vllm/<model-or-path> is vLLM's offline engine — so a local
    doctor, an API patient and an API summarizer meet in one run. The task's options are -T KEY=VALUE. Every request is
    cached (--cache), so a killed run resumes and a re-run makes no call; --estimate prints each role's calls, tokens
    and cost first and sends nothing. Writes a release (the task's tables and manifest.json).
    """
    from craftmd.commands.serving import serving
    from craftmd.generation.runner import runner

    served, spec = serve_plan(args, spec_of(args))
    with serving(served, lambda: runner(spec)) as run:  # the whole run checked (one line) before any server starts
        return _generate(run, args.estimate)


def _generate(run, estimate: bool) -> int:
    """Run (or, ``estimate``, only estimate) the runner ``run``; one line when nothing succeeded."""
    if estimate:
        print(run.estimate_text())
        return 0
    report = run.run()
    print(report.summary(), file=sys.stderr)
    if report.answers and not report.answer_status.get("ok"):  # written, with its failures: but nothing to score
        raise CraftMDError(
            f"nothing succeeded: none of the {report.answers} answers is ok ("
            + ", ".join(f"{k} {v}" for k, v in sorted(report.answer_status.items()))
            + f"); {report.path} is written with every failure's reason in its error column"
        )
    if not report.answers and report.conversations and report.failed_conversations == report.conversations:
        raise CraftMDError(
            f"nothing succeeded: all {report.conversations} conversations failed; {report.path} is written with "
            "every failure's reason in its error column"
        )
    return 0


def spec_of(args):
    """The run spec of ``craftmd generate``'s arguments (one line for what is missing or malformed)."""
    from craftmd.generation.runner import GenerateSpec

    roles, options = pairs(args.roles, "--role"), pairs(args.options, "-T")
    doctor = args.doctor or roles.pop("doctor", None)
    if not doctor:
        raise CraftMDError("generate needs the model under test: --doctor MODEL (or --role doctor=MODEL)")
    if args.base_url:
        check_base_url(args.base_url)
    return GenerateSpec(
        task=args.task,
        dataset=Path(args.dataset),
        out=args.out,
        doctor=doctor,
        patient=args.patient,
        roles=roles,
        options=options,
        config=args.config,
        cases=args.cases,
        trials=args.trials,
        experiments=args.experiments,
        seed=args.seed,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        base_url=args.base_url,
        concurrency=args.concurrency,
        server_concurrency=args.server_concurrency,
        engine_args=args.engine_args,
        workers=args.workers,
        timeout=args.timeout,
        max_retries=args.max_retries,
        price=args.price,
        budget=args.budget,
        cache=args.cache,
        prompt_set=args.prompt_set,
        shard=args.shard,
        overwrite=args.overwrite or args.estimate,
        progress=not args.quiet,
    )
