"""``craftmd keyinfo extract``: the key-value information of the consultation protocol (scored by ``craftmd score --scorer keyinfo``)."""

from __future__ import annotations

import sys
from pathlib import Path

from craftmd import CraftMDError
from craftmd.commands import cli
from craftmd.commands.serving import add_serve_arguments


def _extract(args) -> int:
    """extract each case's key-value medical information and initial request with a model (the keyinfo config)

    One request per text case (all, or --cases) through the request cache, with the versioned prompt set
    generation/prompts/keyinfo-v1; the JSON reply is checked, and every case gets a row of the dataset's
    keyinfo config: its (key, value) items and the patient's initial request, or its failure (status invalid,
    refusal or error, with the reason), listed at the end. The config holds the cases of this run, with the
    producing model and the prompt set's sha256. Exit status 2 when no case was extracted (the reason that failed
    most is named); 0 when some were, the failed ones counted.
    """
    from craftmd.commands.serving import logs_folder, plan, serving
    from craftmd.generation.keyinfo import extract_keyinfo

    if args.base_url:
        cli.check_base_url(args.base_url)
    calls = cli.keywords(args, "base_url", "cache", "concurrency", "max_retries", "timeout")
    served, called = plan(args, {"model": args.model}, logs_folder(args.dataset, "keyinfo"))
    with serving(served):
        report = extract_keyinfo(args.dataset, called["model"], cases=args.cases, progress=not args.quiet, **calls)
    print(report.summary(), file=sys.stderr)
    if report.cases and not report.ok:  # written, with every failure: but nothing to score against
        raise CraftMDError(
            f"nothing extracted: all {report.cases} cases failed (mostly {cli.dominant_reason(report.failed.values())}); "
            f"{report.path} is written with every failure's reason"
        )
    return 0


def register(sub) -> None:
    """Add ``craftmd keyinfo extract`` to the `craftmd` parser."""
    p = sub.add_parser(
        "keyinfo",
        help="key-value medical information: extract it with a model (craftmd score --scorer keyinfo scores against it)",
    )
    inner = p.add_subparsers(dest="keyinfo_command", metavar="STEP", required=True)
    e = cli.command(inner, "extract", _extract)
    cli.add_dataset_argument(e)
    e.add_argument("--model", required=True, metavar="PROVIDER/MODEL", help="the extracting model")
    e.add_argument(
        "--base-url", metavar="URL", help="OpenAI-compatible server for openai/ models (default: OPENAI_BASE_URL or OpenAI)"
    )
    add_serve_arguments(e, "model (--model's)", "DIR.keyinfo-servers/ beside the dataset DIR")
    cli.add_cases_argument(e, "only these case ids (of the all config)")
    e.add_argument("--cache", type=Path, metavar="PATH", help="request cache (default $CRAFTMD_CACHE/requests.sqlite)")
    e.add_argument("--concurrency", type=cli.positive_int, default=8, help="requests in flight (default 8)")
    e.add_argument(
        "--max-retries",
        type=cli.count_type,
        default=6,
        help="retries of a failed call before it is recorded as an error (default 6)",
    )
    e.add_argument(
        "--timeout", type=cli.seconds_type, default=120.0, help="seconds to wait for one reply before retrying (default 120)"
    )
    cli.add_quiet_argument(e)


__all__ = ["register"]
