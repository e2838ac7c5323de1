"""``craftmd grader-agreement``: the offline FRQ grader against the recorded GPT-4 grader-AI and the dermatologists."""

from __future__ import annotations

from craftmd.commands.cli import add_dataset_argument, add_source_argument, command


def register(sub) -> None:
    """Add ``craftmd grader-agreement`` to the `craftmd` parser."""
    a = command(sub, "grader-agreement", _agreement)
    a.add_argument("--releases", required=True, help="folder of releases")
    add_dataset_argument(a, help="built dataset folder (the held-out rule needs each case's source)")
    a.add_argument("--out", required=True, help="audits folder")
    add_source_argument(a)
    a.add_argument("--no-source", action="store_true", help="skip the comparison with the dermatologists (needs the source)")


def _agreement(args):
    """write the audit: offline FRQ grader vs the recorded GPT-4 grader-AI (kappa per model and setting)

    Compare the offline grader's FRQ grades with the recorded upstream-gpt4 labels in every release under
    --releases that has both (grade them first: craftmd score REL --scorer offline), per model, setting and
    split (training vs the fixed held-out cases), and write OUT/grader_agreement.json, an audit the
    leaderboard page renders. With the pinned source (the default), every FRQ grader of the GPT-4 release
    (gpt4_1106) is also compared with the dermatologists' verdicts of upstream's grader validation.
    """
    from craftmd.analysis.agreement.graders import write_audit
    from craftmd.source import Source

    source = None if args.no_source else Source(args.source)
    print(write_audit(args.releases, args.out, args.dataset, source))
    return 0


__all__ = ["register"]
