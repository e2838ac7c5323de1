"""Rendering cards: a YAML header (written by huggingface_hub) over a markdown template.

Templates are ``cards/<name>.md`` with ``$placeholders`` (:class:`string.Template`);
every placeholder must be given, so a card never ships with a hole in it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from string import Template

from huggingface_hub import DatasetCard, DatasetCardData

from craftmd import CraftMDError


def template(name: str) -> Template:
    """The card template ``cards/<name>.md``."""
    path = Path(str(resources.files("craftmd.cards") / f"{name}.md"))
    if not path.exists():
        raise CraftMDError(f"no card template {name!r} at {path}")
    return Template(path.read_text(encoding="utf-8"))


def render_body(name: str, context: dict) -> str:
    """Fill a template; a missing placeholder is an error naming it."""
    try:
        return template(name).substitute({k: str(v) for k, v in context.items()})
    except KeyError as exc:
        raise CraftMDError(f"card template {name!r}: no value for ${exc.args[0]}") from None


def render_card(name: str, context: dict, data: DatasetCardData) -> str:
    """A complete card: ``---`` YAML metadata ``---`` then the filled template."""
    body = render_body(name, context)
    card = DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
    return str(card)
