"""The leaderboard page (one static HTML file, no external assets) and its markdown twin.

The template is ``cards/leaderboard.html`` (``string.Template`` placeholders); every
value is HTML-escaped here. Figures are relative PNGs under ``figures/``.
"""

from __future__ import annotations

import html
import json
import shutil
from importlib import resources
from pathlib import Path
from string import Template

import polars as pl

from .view import FORMAT_LABELS, SETTING_LABELS, SETTING_NOTES, UPSTREAM_SETTINGS, View, frq_rank

LEAD = ("multiturn", "frq")


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _f(x: float | None, d: int = 3) -> str:
    return "–" if x is None else f"{x:.{d}f}"


def _acc_td(r: dict | None, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    if not r:
        return f'<td{c} data-v="-1">–</td>'
    return f'<td{c} data-v="{r["accuracy"]:.6f}">{r["accuracy"]:.3f}<span class="ci">{r["ci_low"]:.3f}–{r["ci_high"]:.3f}</span></td>'


def _table(columns: list[str], rows: list[list[str]], cls: str = "", raw: bool = False) -> str:
    head = "".join(f'<th class="{"txt" if i == 0 else ""}">{_e(c)}</th>' for i, c in enumerate(columns))
    body = "".join("<tr>" + "".join(cell if raw else f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _kind(k: str) -> str:
    return f'<span class="tag {_e(k)}">{_e(k)}</span>'


# -- sections ------------------------------------------------------------------------------------


def _lead(v: View) -> str:
    if not v.models:
        return '<p class="lead">No graded release to show.</p>'
    best = v.models[0]
    r = v.cell(best, *LEAD)
    vig = v.cell(best, "vignette", "frq")
    mcq = v.cell(best, "vignette", "mcq4")
    if not r:
        return ""
    parts = [
        f"<p class=\"lead\"><b>Conversational free-response accuracy</b> — the model interviews a patient and must name the diagnosis "
        f"without choices — is the paper's recommended measure and leads this board. The best model here, <b>{_e(v.display(best))}</b>, "
        f"names the right diagnosis after a multi-turn conversation in <b>{r['accuracy']:.1%}</b> of trials "
        f"(95% CI {r['ci_low']:.1%}–{r['ci_high']:.1%})"
    ]
    if vig and mcq:
        parts.append(f", against {vig['accuracy']:.1%} when handed the whole vignette and {mcq['accuracy']:.1%} on the vignette's four-choice MCQ")
    parts.append(". Exam-style accuracy overstates conversational diagnosis.</p>")
    return "".join(parts)


def _board(v: View) -> str:
    cols = [("#", ""), ("Model", "txt"), ("Kind", "txt"), ("Multi-turn FRQ", "leadcol")]
    cols += [(f"{SETTING_LABELS[s]} FRQ", "") for s in UPSTREAM_SETTINGS if s != "multiturn"]
    cols += [(f"{SETTING_LABELS[s]} MCQ", "") for s in UPSTREAM_SETTINGS]
    cols += [("Cases", ""), ("FRQ grader", "txt")]
    head = "".join(f'<th class="{c}">{_e(n)}</th>' for n, c in cols)
    rows = []
    for i, m in enumerate(v.models, 1):
        cells = [f'<td data-v="{i}">{i}</td>', f'<td class="txt" title="{_e(v.release_info[m]["model"])}">{_e(v.display(m))}</td>', f'<td class="txt">{_kind(v.kind(m))}</td>']
        cells.append(_acc_td(v.cell(m, *LEAD), "leadcol"))
        cells += [_acc_td(v.cell(m, s, "frq")) for s in UPSTREAM_SETTINGS if s != "multiturn"]
        cells += [_acc_td(v.cell(m, s, "mcq4")) for s in UPSTREAM_SETTINGS]
        lead = v.cell(m, *LEAD) or v.cell(m, "vignette", "mcq4") or {}
        cells.append(f'<td data-v="{lead.get("n_cases", 0)}">{lead.get("n_cases", "–")}</td>')
        cells.append(f'<td class="txt"><code>{_e(v.grader_for(m, "frq") or "none")}</code></td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="leaderboard" class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _missing(v: View) -> str:
    st = v.a.answer_status
    if st.height == 0:
        return ""
    agg = st.group_by("model").agg(pl.col("n_answers", "n_ok", "n_missing", "n_non_text", "n_failed").sum()).sort("model")
    bad = agg.filter(pl.col("n_ok") < pl.col("n_answers"))
    if bad.height == 0:
        return '<p class="note">Every answer of every release is usable text.</p>'
    rows = [[v.display(r["model"]), f"{r['n_answers']:,}", f"{r['n_missing']:,}", f"{r['n_non_text']:,}", f"{r['n_failed']:,}"] for r in bad.iter_rows(named=True)]
    return (
        "<h3>Answers that are missing or not text</h3><p>They stay in the data and count as wrong (never dropped), as in the paper.</p>"
        + _table(["Model", "Answers", "Missing", "Not text", "Refused / failed"], rows)
    )


def _heat(x: float) -> str:
    # white -> warm orange, by accuracy
    t = max(0.0, min(1.0, x))
    r, g, b = 255, int(255 - 110 * t), int(255 - 190 * t)
    return f"background: rgb({r},{g},{b})"


def _spec_tables(v: View) -> tuple[str, str]:
    opts, tables = [], []
    for fmt in ("frq", "mcq4"):
        for s in UPSTREAM_SETTINGS:
            key = f"{s}-{fmt}"
            sel = " selected" if (s, fmt) == LEAD else ""
            opts.append(f'<option value="{key}"{sel}>{_e(SETTING_LABELS[s])} · {_e(FORMAT_LABELS[fmt])}</option>')
            head = '<th class="txt">Specialty</th><th>Cases</th>' + "".join(f"<th>{_e(v.display(m))}</th>" for m in v.models)
            rows = []
            for sp in v.specialties:
                cells = [f'<td class="txt">{_e(sp)}</td>', f'<td data-v="{v.n_cases(sp)}">{v.n_cases(sp)}</td>']
                for m in v.models:
                    r = v.cell(m, s, fmt, group_by="specialty", group=sp)
                    if r:
                        cells.append(f'<td data-v="{r["accuracy"]:.6f}" style="{_heat(r["accuracy"])}" title="95% CI {r["ci_low"]:.3f}–{r["ci_high"]:.3f}">{r["accuracy"]:.3f}</td>')
                    else:
                        cells.append('<td data-v="-1">–</td>')
                rows.append("<tr>" + "".join(cells) + "</tr>")
            tables.append(
                f'<div class="spec-table" data-key="{key}"><table class="sortable" id="spec-{key}"><thead><tr>{head}</tr></thead>'
                f'<tbody>{"".join(rows)}</tbody></table></div>'
            )
    return "".join(opts), "".join(tables)


def _dataset_table(v: View) -> str:
    groups = []
    datasets = sorted({k[6] for k in v._acc if k[5] == "dataset" and not k[4]})
    for d in datasets:
        groups.append(("dataset", d, d))
    groups.append(("single_dx", "all", "single-diagnosis subset"))
    for d in datasets:
        groups.append(("single_dx", d, f"{d}, single-diagnosis"))
    rows = []
    for gb, g, label in groups:
        first = next((v.cell(m, *LEAD, group_by=gb, group=g) for m in v.models if v.cell(m, *LEAD, group_by=gb, group=g)), None)
        if not first:
            continue
        cells = [f'<td class="txt">{_e(label)}</td>', f'<td>{first["n_cases"]}</td>']
        for m in v.models:
            r1 = v.cell(m, *LEAD, group_by=gb, group=g)
            r2 = v.cell(m, "vignette", "mcq4", group_by=gb, group=g)
            cells.append(f"<td>{_f(r1['accuracy'] if r1 else None)} / {_f(r2['accuracy'] if r2 else None)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = '<th class="txt">Cases</th><th>n</th>' + "".join(f"<th>{_e(v.display(m))}</th>" for m in v.models)
    if not rows:
        return '<p class="note">No dataset metadata.</p>'
    return (
        '<p class="note">Each cell: multi-turn FRQ / vignette MCQ accuracy. The single-diagnosis subset keeps the cases whose '
        "vignette admits one most likely diagnosis (dataset column <code>single_dx</code>).</p>"
        f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def _mcq_rules(v: View) -> str:
    gap = v.a.mcq_rule_gap
    models = [m for m in v.models if v.cell(m, "vignette", "mcq4", grader="strict")]
    if not models:
        return '<p class="note">No MCQ answers graded by rule.</p>'
    head = '<th class="txt">Model</th>' + "".join(f"<th>{_e(SETTING_LABELS[s])}: paper</th><th>strict</th><th>Δ</th>" for s in UPSTREAM_SETTINGS) + "<th>Answers naming several choices</th><th>…credited by paper</th>"
    rows = []
    worst, worst_gap = None, 0.0
    for m in models:
        cells = [f'<td class="txt">{_e(v.display(m))}</td>']
        for s in UPSTREAM_SETTINGS:
            p = v.cell(m, s, "mcq4", grader="paper")
            q = v.cell(m, s, "mcq4", grader="strict")
            d = (q["accuracy"] - p["accuracy"]) if p and q else None
            cells += [f"<td>{_f(p['accuracy'] if p else None)}</td>", f"<td>{_f(q['accuracy'] if q else None)}</td>", f"<td>{'–' if d is None else f'{d:+.3f}'}</td>"]
            if d is not None and -d > worst_gap:
                worst, worst_gap = m, -d
        g = gap.filter(pl.col("model") == m)
        n = int(g["n_answers"].sum()) if g.height else 0
        several = int(g["names_several"].sum()) if g.height else 0
        credited = int(g["paper_credits_several"].sum()) if g.height else 0
        cells += [f"<td>{several:,} ({several / n:.1%})</td>" if n else "<td>–</td>", f"<td>{credited:,}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    text = (
        "<p><code>paper</code> is the rule behind the published MCQ tables, recovered from the release: an answer is correct when the "
        "correct choice's text appears in it, case-insensitively. It reproduces the published overall MCQ accuracies. "
        "<code>strict</code> asks that the answer resolve to exactly one of the four choices (its text, its letter, a "
        "<code>Final Diagnosis:</code> line, light paraphrase); an answer naming several choices, or none, is wrong.</p>"
    )
    if worst is not None:
        text += (
            f"<p>The largest gap is <b>{_e(v.display(worst))}</b> (up to {worst_gap:.3f} lower under <code>strict</code>): its verbose answers often "
            "list several of the choices (&ldquo;X or Y&rdquo;, &ldquo;the most likely diagnosis is either X, Y or Z&rdquo;), and <code>paper</code> credits "
            "such an answer whenever the right one is among them. Where <code>strict</code> is <i>higher</i>, the recorded answer key "
            "spells the choice differently from the model (trailing spaces or a stray quote in the key, curly apostrophes, a typo), "
            "which the literal <code>paper</code> match misses.</p>"
        )
    return text + f'<div class="scroll"><table id="mcq-rules-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _grader_reliability(v: View, audits: list[dict]) -> str:
    """Each FRQ grader's measured agreement with the references: the recorded GPT-4 grader-AI (held-out
    answers) and the dermatologists (upstream's grader validation), from the grader-agreement audit."""
    from craftmd.scoring.agreement import AUDIT_ID, GRADER, REFERENCE

    data = next((a.get("data") or {} for a in audits if a.get("id") == AUDIT_ID), {})
    held = (data.get("overall") or {}).get("held-out")
    derm = data.get("dermatologists") or {}
    graders = sorted(set(v.frq_graders_all) | set(derm), key=lambda g: (frq_rank(g), g))
    if not graders or not (held or derm):
        return ""
    rows = []
    for g in graders:
        if g == REFERENCE:
            vs_gpt4 = "the reference"
        elif g == GRADER and held:
            vs_gpt4 = f"{held['agreement']:.1%} agreement, kappa {held['kappa']:.3f} ({held['n']:,} held-out answers)"
        else:
            vs_gpt4 = "not measured"
        d = derm.get(g)
        vs_derm = f"{d['agreement_pct']} % ({d['cases']} cases × 5 trials; counts equal in {d['count_equal_pct']} %)" if d else "not measured"
        rows.append([f'<td class="txt"><code>{_e(g)}</code></td>', f'<td class="txt">{_e(vs_gpt4)}</td>', f'<td class="txt">{_e(vs_derm)}</td>'])
    return (
        "<p>How far each grader can be trusted, as measured on upstream's recorded answers (the grader-agreement audit "
        "below has the per-model and per-setting figures):</p>"
        + '<table id="grader-reliability"><thead><tr>'
        + "".join(f'<th class="txt">{_e(c)}</th>' for c in ("FRQ grader", "vs the recorded GPT-4 grader-AI", "vs dermatologists (GPT-4's vignette answers)"))
        + "</tr></thead><tbody>" + "".join("<tr>" + "".join(r) + "</tr>" for r in rows) + "</tbody></table>"
    )


def _frq_graders(v: View, audits: list[dict] | None = None) -> str:
    text = (
        "<p>Every free-response figure names its grader. <code>upstream-gpt4</code> is the GPT-4 grader-AI's verdict as recorded in the "
        "upstream release (correct / wrong / no diagnosis); <code>offline</code> is this package's deterministic grader (synonyms and "
        "string similarity, no API); <code>llm:&lt;provider/model&gt;</code> is an LLM grader-AI run by this package. The leaderboard uses, per "
        "model, the first available of upstream-gpt4, an LLM grader, offline.</p>"
    )
    graders = v.frq_graders_all
    if len(graders) > 1:
        head = '<th class="txt">Model</th>' + "".join(f"<th>{_e(g)}</th>" for g in graders)
        rows = []
        for m in v.models:
            cells = [f'<td class="txt">{_e(v.display(m))}</td>'] + [_acc_td(v.cell(m, *LEAD, grader=g)) for g in graders]
            rows.append("<tr>" + "".join(cells) + "</tr>")
        text += "<p>Multi-turn FRQ accuracy under each grader that graded the release:</p>"
        text += f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
    return text + _grader_reliability(v, audits or [])


def _tests(v: View) -> str:
    pv = v.a.pvalues
    if pv.height == 0:
        return '<p class="note">No paired comparisons.</p>'
    rows = []
    for m in v.models:
        for fmt in ("frq", "mcq4"):
            g = v.grader_for(m, fmt)
            sel = pv.filter(
                pl.col("family") == "setting", pl.col("model") == m, pl.col("format") == fmt, pl.col("grader") == g,
                pl.col("group_by") == "all", pl.col("a") == "vignette", pl.col("b") == "multiturn",
            )
            b = sel.filter(pl.col("test") == "paired-bootstrap")
            mc = sel.filter(pl.col("test") == "mcnemar")
            if b.height:
                rb, rm = b.row(0, named=True), (mc.row(0, named=True) if mc.height else None)
                rows.append([v.display(m), FORMAT_LABELS[fmt], g, f"{rb['diff']:+.3f}", _p(rb["p_adjusted"]), _p(rm["p_adjusted"]) if rm else "–"])
    text = (
        "<p>Paired tests between settings of one model and between models in one setting, for every group (overall, specialty, "
        "dataset, single-diagnosis): a paired bootstrap over cases (two-sided, (extreme + 1) / (B + 1), as the paper's Methods) "
        "and, overall, per dataset and on the single-diagnosis subset, McNemar's test on paired trials; p-values are "
        "Holm-adjusted within each family (one model's settings, or one "
        "setting's models). All of them are in <a href=\"tables/pvalues.csv\">tables/pvalues.csv</a>. The headline contrast, "
        "vignette minus multi-turn:</p>"
    )
    return text + _table(["Model", "Format", "Grader", "Vignette − multi-turn", "p (bootstrap, Holm)", "p (McNemar, Holm)"], rows)


def _cell(c) -> str:
    if c is None:
        return "–"
    if isinstance(c, float):
        return f"{c:.3g}" if c != 0 and abs(c) < 0.001 else f"{c:.3f}"
    return str(c)


def _audit_html(a: dict, out: Path) -> str:
    parts = [f'<div class="audit" id="audit-{_e(a["id"])}"><h3>{_e(a["title"])}</h3>']
    for para in str(a.get("description", "")).split("\n\n"):
        if para.strip():
            parts.append(f"<p>{_e(para.strip())}</p>")
    for t in a.get("tables", []):
        cols = [str(c) for c in t.get("columns", [])]
        rows = [[_cell(c) for c in r] for r in t.get("rows", [])]
        table = '<div class="scroll">' + _table(cols, rows) + "</div>"
        name = _e(t.get("name") or "Table")
        if len(rows) > 12:  # long tables fold away
            parts.append(f"<details><summary>{name} ({len(rows)} rows)</summary>{table}</details>")
        else:
            parts.append(f'<p class="note">{name}</p>{table}')
    base = Path(a.get("_dir", "."))
    for fig in a.get("figures", []):
        src = (base / fig).resolve()
        if not src.is_file():
            parts.append(f'<p class="note">(figure {_e(fig)} not found)</p>')
            continue
        rel = Path("figures") / "audits" / str(a["id"]) / src.name
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out / rel)
        parts.append(f'<figure><img src="{_e(rel.as_posix())}" alt="{_e(a["title"])}"></figure>')
    parts.append("</div>")
    return "".join(parts)


def _trust(v: View, audits: list[dict], out: Path) -> str:
    text = [
        "<ul>",
        f"<li><b>Sampling error.</b> Intervals resample cases ({v.a.B:,} times, seed {v.a.seed}); a case's five trials stay together, so "
        "the interval reflects how many cases there are, not how many trials.</li>",
        "<li><b>Grader error.</b> Free-response verdicts come from a grader, not a clinician; the audits below measure how often "
        "graders agree with each other and with experts.</li>",
        "<li><b>Answer-key and rule choices.</b> The MCQ rule matters (see above); some MedQA items ask for a test or next step, "
        "not a diagnosis, and some vignettes admit more than one diagnosis (see the single-diagnosis subset).</li>",
        "<li><b>Patient-AI.</b> Conversations are with a simulated patient; its fidelity bounds what the conversational setting measures.</li>",
        "</ul>",
    ]
    if audits:
        text += [_audit_html(a, out) for a in audits]
    else:
        text.append('<p class="note">No audit was supplied to this build (pass <code>--audits DIR</code> with audit JSON files).</p>')
    return "".join(text)


def _notes(v: View) -> str:
    items = [f"<li><b>{_e(SETTING_LABELS[s])}.</b> {_e(SETTING_NOTES[s])}</li>" for s in UPSTREAM_SETTINGS]
    items.append("<li><b>Formats.</b> MCQ: the four choices are shown and one must be picked. FRQ: no choices; the model names "
                 "the diagnosis, and a grader decides whether it matches the answer.</li>")
    items.append("<li><b>Accuracy.</b> As in the paper: a case scores the mean over its trials (5 upstream), a model the mean over "
                 "cases; all 2,004 cases count (the paper says 2,000, four being for prompt design, but its figures are reproduced "
                 "with all 2,004). Missing or non-text answers count as wrong.</li>")
    text = "<ul>" + "".join(items) + "</ul>"
    rel_items = []
    for m in v.models + v.image_models:
        n = v.notes(m)
        extra = " ".join(str(n[k]) for k in ("coverage", "mcq", "frq_labels") if k in n and (m in v.image_models))
        rel_items.append(f"<li><b>{_e(v.display(m))}</b> (<code>{_e(m)}</code>, {_e(v.release_info[m]['model'])}, {_kind(v.kind(m))}){': ' + _e(extra) if extra else ''}</li>")
    text += "<h3>Releases</h3><ul>" + "".join(rel_items) + "</ul>"
    if v.image_models:
        rows = []
        for m in v.image_models:
            for g in v.frq_graders_all:
                for s in UPSTREAM_SETTINGS:
                    r = v.cell(m, s, "frq", grader=g, with_image=True)
                    if r:
                        rows.append([v.display(m), SETTING_LABELS[s], g, str(r["n_cases"]), f"{r['accuracy']:.3f} ({r['ci_low']:.3f}–{r['ci_high']:.3f})"])
        text += ("<h3>Image cases (NEJM Image Challenge)</h3><p>Shown apart from the leaderboard: a different case set, only partly "
                 "present in the pinned source, and without answer choices (so no MCQ rule applies).</p>"
                 + _table(["Model", "Setting", "FRQ grader", "Cases", "FRQ accuracy"], rows))
    return text


def _footer(v: View) -> str:
    commits = sorted({json.loads(v.release_info[m]["source"]).get("commit") or "" for m in v.models + v.image_models} - {""})
    src = f" Upstream data: CRAFT-MD release, commit {', '.join(c[:12] for c in commits)} (MIT licence)." if commits else ""
    return (
        "Regenerate with <code>make leaderboard</code> (build → ingest → grade → analyse → page). Tables: "
        '<a href="tables/accuracy.csv">accuracy.csv</a>, <a href="tables/pvalues.csv">pvalues.csv</a>, '
        '<a href="tables/answer_status.csv">answer_status.csv</a>, <a href="tables/mcq_rule_gap.csv">mcq_rule_gap.csv</a>.' + src
    )


# -- writers -------------------------------------------------------------------------------------


def _template() -> Template:
    return Template((Path(str(resources.files("craftmd.cards"))) / "leaderboard.html").read_text())


def render(a, out: Path, audits: list[dict] | None = None) -> str:
    v = View(a)
    opts, spec = _spec_tables(v)
    return _template().substitute(
        lead=_lead(v),
        B=f"{a.B:,}",
        seed=a.seed,
        board=_board(v),
        missing=_missing(v),
        spec_options=opts,
        spec_tables=spec,
        dataset_table=_dataset_table(v),
        mcq_rules=_mcq_rules(v),
        frq_graders=_frq_graders(v, audits),
        tests=_tests(v),
        trust=_trust(v, audits or [], out),
        notes=_notes(v),
        footer=_footer(v),
    )


def markdown(a, audits: list[dict] | None = None) -> str:
    v = View(a)
    lines = ["# CRAFT-MD leaderboard", "", "Conversational free-response accuracy (multi-turn FRQ) leads; 95% bootstrap CIs over cases "
             f"({a.B:,} resamples, seed {a.seed}). MCQ uses the `paper` rule.", ""]
    head = ["#", "Model", "Kind", "Multi-turn FRQ"] + [f"{SETTING_LABELS[s]} FRQ" for s in UPSTREAM_SETTINGS if s != "multiturn"]
    head += [f"{SETTING_LABELS[s]} MCQ" for s in UPSTREAM_SETTINGS] + ["FRQ grader"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def c(r):
        return "–" if not r else f"{r['accuracy']:.3f} ({r['ci_low']:.3f}–{r['ci_high']:.3f})"

    for i, m in enumerate(v.models, 1):
        row = [str(i), v.display(m), v.kind(m), c(v.cell(m, *LEAD))]
        row += [c(v.cell(m, s, "frq")) for s in UPSTREAM_SETTINGS if s != "multiturn"]
        row += [c(v.cell(m, s, "mcq4")) for s in UPSTREAM_SETTINGS]
        row.append(f"`{v.grader_for(m, 'frq') or 'none'}`")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## MCQ: `paper` vs `strict` rule (overall accuracy)", ""]
    lines += ["| Model | " + " | ".join(f"{SETTING_LABELS[s]} paper / strict" for s in UPSTREAM_SETTINGS) + " |", "|---|" + "---|" * len(UPSTREAM_SETTINGS)]
    for m in v.models:
        cells = []
        for s in UPSTREAM_SETTINGS:
            p, q = v.cell(m, s, "mcq4", grader="paper"), v.cell(m, s, "mcq4", grader="strict")
            cells.append(f"{_f(p['accuracy'] if p else None)} / {_f(q['accuracy'] if q else None)}")
        lines.append(f"| {v.display(m)} | " + " | ".join(cells) + " |")
    lines += ["", "## Settings", ""] + [f"- **{SETTING_LABELS[s]}**: {SETTING_NOTES[s]}" for s in UPSTREAM_SETTINGS]
    if audits:
        lines += ["", "## Audits", ""] + [f"- **{a_['title']}** (`{a_['id']}`)" for a_ in audits]
    lines += ["", "Tables: `tables/accuracy.csv`, `tables/pvalues.csv`. Figures: `figures/*.png`. The page: `index.html`.", ""]
    return "\n".join(lines)


def write_page(a, out: Path | str, audits: list[dict] | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    page.write_text(render(a, out, audits))
    (out / "leaderboard.md").write_text(markdown(a, audits))
    return page


__all__ = ["write_page", "render", "markdown"]
