"""What each task declares, written as Markdown at build time (``docs/_generated/task_<name>.md``).

A task's page includes its folder's ``README.md`` (what it measures, what its numbers compare with) and then this
generated part: its roles, its options (the pydantic class ``craftmd generate -T`` reads), its experiment matrix,
its scorers and metrics, read from the registered task itself, so the page cannot drift from the code.
"""

from __future__ import annotations

from pathlib import Path


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def task_markdown(task) -> str:
    """The Markdown of one registered task's declarations."""
    out = [f"## What `{task.name}` declares", "", f"{task.description}.", "", f"Dataset: `{task.dataset}`.", ""]
    out += ["### Roles", "", "| role | what it does | defaults to |", "|---|---|---|"]
    out += [f"| `{r.name}` | {_cell(r.help)} | {f'`{r.default}`' if r.default else '-'} |" for r in task.roles]
    fields = task.options.model_fields if task.options is not None else {}
    out += ["", "### Options (`-T KEY=VALUE`)", ""]
    if fields:
        out += ["| option | default | what it sets |", "|---|---|---|"]
        for name, f in fields.items():
            out.append(f"| `{name}` | `{f.default!r}` | {_cell(f.description or '')} |")
    else:
        out.append("None.")
    out += [
        "",
        "### Experiments",
        "",
        "| setting | format | conversation read | needs the exam apart | image cases |",
        "|---|---|---|---|---|",
    ]
    for e in task.experiments:
        out.append(
            f"| `{e.setting}` | `{e.format}` | {e.conversation or '-'} | {'yes' if e.exam else 'no'} | {'yes' if e.image else 'no'} |"
        )
    out += ["", "### Scorers and metrics", ""]
    out.append("Default scorers: " + ", ".join(f"`{s}`" for s in task.scorers) + ".")
    out.append("")
    out.append("Metrics: " + ", ".join(f"`{m}`" for m in task.metrics) + ".")
    return "\n".join(out) + "\n"


def generate(app) -> None:
    from craftmd.tasks import BUILTIN, get_task

    out = Path(app.srcdir) / "_generated"
    out.mkdir(exist_ok=True)
    for name in BUILTIN:
        text = task_markdown(get_task(name))
        path = out / f"task_{name}.md"
        if not path.exists() or path.read_text() != text:  # unchanged files keep their times: no needless rebuild
            path.write_text(text)


def setup(app):
    app.connect("builder-inited", generate)
    return {"parallel_read_safe": True, "version": "1"}
