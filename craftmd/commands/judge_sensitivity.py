"""``craftmd judge-sensitivity RELEASES``: how far judged profiles move under other judge settings."""

from __future__ import annotations

import json
from pathlib import Path

from craftmd.commands.cli import add_list_argument, check_base_url, command, positive_int, resamples_type, seed_type
from craftmd.commands.serving import add_serve_arguments


def _sensitivity(args) -> int:
    """re-judge a sample of judged releases under other judge settings and report how far the profiles move

    For every judged release under RELEASES, --n of its judged conversations (seeded) are judged again with the
    release's judge changed one way at a time: its sampling seed, its dimension order, another judge model
    (--other-judge) and a paraphrased prompt set. Per release and change: the drift of the overall score and of each
    meta-category (0-100 points, variant minus the release's own scores on the same conversations) with 95 %
    case-bootstrap CIs, and, with two or more releases, Kendall's tau between the models' order before and after.
    Written to RELEASES/judge-sensitivity/ (sensitivity.csv, sensitivity.json); craftmd analyse shows it on the page.
    """
    from craftmd.analysis.agreement.judge_sensitivity import sensitivity
    from craftmd.commands.serving import logs_folder, plan, serving

    if args.base_url:
        check_base_url(args.base_url)
    served, called = plan(args, {"judge": args.other_judge}, logs_folder(Path(args.releases), "judge-sensitivity"))
    with serving(served):
        res = sensitivity(args.releases, called["judge"], n=args.n, seed=args.seed, B=args.B, base_url=args.base_url, cache=args.cache,
                          dataset_dir=args.dataset, variants=args.variants)  # fmt: skip
    print(
        json.dumps(
            {"written": str(args.releases.rstrip("/") + "/judge-sensitivity"), "kendall_tau": res["kendall_tau"]}, sort_keys=True
        )
    )
    return 0


def register(sub) -> None:
    """Add ``craftmd judge-sensitivity`` to the `craftmd` parser."""
    from craftmd.analysis.agreement.judge_sensitivity import VARIANTS

    s = command(sub, "judge-sensitivity", _sensitivity)
    s.add_argument("releases", metavar="RELEASES", help="folder of release folders, judged")
    s.add_argument("--other-judge", required=True, metavar="PROVIDER/MODEL", help="the judge model of the 'model' variant")
    s.add_argument("--n", type=positive_int, default=10, help="conversations re-judged per release (default 10)")
    s.add_argument("--seed", type=seed_type, default=0, help="the sample's and the bootstrap's seed (default 0)")
    s.add_argument("--B", type=resamples_type, default=1000, help="bootstrap resamples (default 1000)")
    add_list_argument(s, "--variants", "NAME[,NAME...]", f"only these of {', '.join(VARIANTS)} (default all)")
    s.add_argument("--dataset", metavar="DIR", default=None, help="the built dataset (an encounters release: the medpi folder)")
    s.add_argument("--base-url", default=None, help="the judges' OpenAI-compatible server (openai/ models)")
    add_serve_arguments(s, "judge (--other-judge's model)", "RELEASES.judge-sensitivity-servers/ beside RELEASES")
    s.add_argument("--cache", default=None, help="the call cache (sqlite)")


__all__ = ["register"]
