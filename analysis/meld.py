"""The contamination check's audit (MELD, :mod:`craftmd.scoring.meld`): what the page says of one MELD run.

:func:`meld_audit` reads a run's summary (``summary.json``) and its histogram and writes the audit
dict the page shows (title, description, a table per config); :func:`write_meld_audit` writes it with
its figure to an audits folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from craftmd import CraftMDError
from craftmd.atomic import atomic_write_bytes, atomic_write_json
from craftmd.registry import slug
from craftmd.scoring.meld import FIGURE, read_summary


def meld_audit(meld_dir: Path | str) -> dict:
    """The audit dict of one MELD run (figure path relative to ``meld_dir``)."""
    s = read_summary(meld_dir)
    model = s["model"]
    rows = []
    for name, st in [*sorted(s["configs"].items()), ("all", s["overall"])]:
        share = st["share_flagged"]
        rows.append([
            name, st["n"], st["n_failed"], st["n_flagged"],
            None if share is None else round(100 * share, 2),
            st["mean_similarity"], st["max_similarity"],
        ])  # fmt: skip
    o = s["overall"]
    share = "n/a" if o["share_flagged"] is None else f"{100 * o['share_flagged']:.2f} %"
    desc = (
        f"Contamination check (MELD) of {model}: given the first half of each vignette and asked to "
        f"write the second half, the model's completion is compared with the true second half. "
        f"Similarity = {s['similarity']}; a case with similarity ≥ {s['threshold']} is flagged as likely memorised. "
        f"{o['n_flagged']} of {o['n_ok']} cases flagged ({share}); {o['n_failed']} requests failed. "
        f"Split rule: {s['split']}; prompt sha256 {s['prompt']['sha256'][:12]}; sampling {json.dumps(s['sampling'], sort_keys=True)}."
    )
    figures = [FIGURE] if (Path(meld_dir) / FIGURE).exists() else []
    return {
        "id": f"meld-{slug(model)}",
        "title": f"Contamination (MELD): {model}",
        "description": desc,
        "tables": [
            {
                "name": "Cases flagged as likely memorised, per config",
                "columns": ["config", "cases", "failed", "flagged", "flagged %", "mean similarity", "max similarity"],
                "rows": rows,
            }
        ],  # fmt: skip
        "figures": figures,
    }


def write_meld_audit(meld_dir: Path | str, audits_dir: Path | str) -> Path:
    """Write ``<audits_dir>/<id>.json`` with its figure copied beside it as ``<id>.png``."""
    audit = meld_audit(meld_dir)
    audits_dir = Path(audits_dir)
    audits_dir.mkdir(parents=True, exist_ok=True)
    _check_not_another_models(audits_dir / f"{audit['id']}.json", audit)
    if audit["figures"]:
        fig = f"{audit['id']}.png"
        atomic_write_bytes(audits_dir / fig, (Path(meld_dir) / audit["figures"][0]).read_bytes())
        audit["figures"] = [fig]
    path = audits_dir / f"{audit['id']}.json"
    return atomic_write_json(path, audit)


def _check_not_another_models(path: Path, audit: dict) -> None:
    """Refuse to replace the audit of another model whose name makes the same file name (``openai/x`` and
    ``openai:x``): one line, both kept apart (the audit of the same model is replaced, as a rerun should)."""
    if not path.exists():
        return
    try:
        title = json.loads(path.read_bytes()).get("title")
    except (OSError, ValueError, AttributeError):
        title = None
    if title != audit["title"]:
        raise CraftMDError(
            f"{path} holds another audit ({str(title)[:80]!r}) whose name makes the same file name as "
            f"{audit['title']!r}; give the audits another --audits folder"
        )


__all__ = ["meld_audit", "write_meld_audit"]
