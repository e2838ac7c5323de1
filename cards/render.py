"""Rendering the dataset cards: a YAML header (written by huggingface_hub) over a markdown template.

Templates are ``cards/<name>.md.j2`` (Jinja2, the engine of the leaderboard's templates too), rendered
with every name required (``StrictUndefined``), so a card never ships with a hole in it.
"""

from __future__ import annotations

from functools import cache

import jinja2
from huggingface_hub import DatasetCard, DatasetCardData

from craftmd import CraftMDError


@cache
def environment() -> jinja2.Environment:
    """The card templates of ``cards/`` (markdown: no escaping; an undefined name is an error)."""
    return jinja2.Environment(loader=jinja2.PackageLoader("craftmd.cards", ""), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)  # fmt: skip


def render_body(name: str, context: dict) -> str:
    """Fill ``cards/<name>.md.j2``; a missing template or value is a one-line error naming it."""
    try:
        return environment().get_template(f"{name}.md.j2").render(context)
    except jinja2.TemplateNotFound:
        raise CraftMDError(f"no card template {name!r} (cards/{name}.md.j2)") from None
    except jinja2.UndefinedError as exc:
        raise CraftMDError(f"card template {name!r}: {exc.message}") from None


def render_card(name: str, context: dict, data: DatasetCardData) -> str:
    """A complete card: ``---`` YAML metadata ``---`` then the filled template."""
    body = render_body(name, context)
    card = DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
    return str(card)


__all__ = ["render_card", "render_body", "environment"]
