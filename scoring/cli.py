"""Subcommands of craftmd.scoring (registered by craftmd.cli)."""

from __future__ import annotations


def register(sub) -> None:
    """Add this room's subcommands to the `craftmd` parser."""
    from craftmd.scoring.audit_cli import register_audits  # meld, review (helper E)

    register_audits(sub)
