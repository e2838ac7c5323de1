"""The one Jinja2 environment of the package: the dataset cards and the leaderboard page fill ``cards/`` templates.

Every template is rendered with every name required (``StrictUndefined``: a card or page never ships with a hole
in it), block tags trimmed, and the formatting filters below; HTML autoescaped, markdown not. A card is a YAML
header (written by huggingface_hub) over a filled ``cards/<name>.md.j2``.
"""

from __future__ import annotations

import html
from functools import cache

import jinja2
from huggingface_hub import DatasetCard, DatasetCardData

from craftmd import CraftMDError

# -- formatting, for the templates ---------------------------------------------------------------


def fixed(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def thousands(n: int) -> str:
    return f"{n:,}"


def signed(x: float | None) -> str:
    return "–" if x is None else f"{x:+.3f}"


def p_value(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def audit_cell(c) -> str:
    if c is None:
        return "–"
    if isinstance(c, float):
        return f"{c:.3g}" if c != 0 and abs(c) < 0.001 else f"{c:.3f}"
    return str(c)


def md(text) -> str:
    """A name in a markdown table cell: on one line, HTML escaped (``<script>`` shows as text) and ``|`` escaped
    (a pipe in a name never shifts the columns)."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def md_code(text) -> str:
    """A name in a markdown code span inside a table cell: ``|`` escaped (markdown shows the rest as it is)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def heat(x: float) -> str:
    """White -> warm orange, by accuracy (a cell's background)."""
    t = max(0.0, min(1.0, x))
    r, g, b = 255, int(255 - 110 * t), int(255 - 190 * t)
    return f"background: rgb({r},{g},{b})"


FILTERS = {
    "fixed": fixed,
    "pct": pct,
    "thousands": thousands,
    "signed": signed,
    "p_value": p_value,
    "audit_cell": audit_cell,
    "heat": heat,
    "md": md,
    "md_code": md_code,
}


def task_template(name: str):
    """``task:<task>/<file>``: a template in a registered task's folder (its page section, :class:`craftmd.tasks.Analysis`);
    None for any other name, or a file the task's folder does not hold."""
    from pathlib import Path

    from craftmd.tasks import TASKS

    task, _, file = name.removeprefix("task:").partition("/") if name.startswith("task:") else ("", "", "")
    folder = TASKS[task].folder if task in TASKS else None
    path = Path(folder) / file if folder is not None and file and "/" not in file else None
    if path is None or not path.is_file():
        return None
    mtime = path.stat().st_mtime_ns
    return path.read_text(encoding="utf-8"), str(path), lambda: path.is_file() and path.stat().st_mtime_ns == mtime


@cache
def environment(autoescape: bool) -> jinja2.Environment:
    """The templates of ``cards/`` and the tasks' own (:func:`task_template`): HTML autoescaped, markdown not; an undefined
    name is an error."""
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.PackageLoader("craftmd.cards", ""), jinja2.FunctionLoader(task_template)]),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(FILTERS)
    return env


def render_body(name: str, context: dict) -> str:
    """Fill ``cards/<name>.md.j2``; a missing template or value is a one-line error naming it."""
    try:
        return environment(False).get_template(f"{name}.md.j2").render(context)
    except jinja2.TemplateNotFound:
        raise CraftMDError(f"no card template {name!r} (cards/{name}.md.j2)") from None
    except jinja2.UndefinedError as exc:
        raise CraftMDError(f"card template {name!r}: {exc.message}") from None


def render_card(name: str, context: dict, data: DatasetCardData) -> str:
    """A complete card: ``---`` YAML metadata ``---`` then the filled template."""
    body = render_body(name, context)
    card = DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
    return str(card)


__all__ = ["render_card", "render_body", "environment", "FILTERS"]
