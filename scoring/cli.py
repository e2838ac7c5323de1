"""Subcommands of craftmd.scoring (registered by craftmd.cli)."""

from __future__ import annotations


def register(sub) -> None:
    """Add this room's subcommands to the `craftmd` parser."""
