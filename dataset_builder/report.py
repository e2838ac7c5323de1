"""The build report: what a build produced and how it compares with upstream."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class SplitCheck:
    """Our vignettes against upstream's own split (results/gpt4_1106 ``case_vignette``)."""

    compared: int = 0
    agreeing: int = 0
    disagreements: list[dict] = field(default_factory=list)  # case_id, ours, upstream, question

    @property
    def agreement(self) -> float:
        return self.agreeing / self.compared if self.compared else 0.0


@dataclass
class BuildReport:
    out: Path
    version: str
    source: dict
    rows: dict[str, int]
    by_source: dict[str, int]
    by_specialty: dict[str, int]
    by_task_type: dict[str, int]
    single_dx: dict[str, int]
    split: SplitCheck
    medqa_rule: dict  # picks, kept, recall, dropped [(case_id, reason, question)], reasons
    colon_stems: list[str]  # cases whose question stem ends with ":" (kept in the vignette, as upstream)
    nejm: dict  # rows, multi_image [case_id]
    answers_renamed: list[str] = field(default_factory=list)  # answers matched to a choice through a synonym
    #: stray closing quotes removed: {"answers": [case_id], "choice_cases": [case_id], "choice_values": int}
    cleaned: dict = field(default_factory=lambda: {"answers": [], "choice_cases": [], "choice_values": 0})
    #: where paper_answer came from: {"from_results": int, "from_csv": int, "differs": [case_id]}
    paper_key: dict = field(default_factory=lambda: {"from_results": 0, "from_csv": 0, "differs": []})
    medqa_file: dict | None = None  # {path, items, picked, reasons} for a --medqa build
    #: cases whose source text is only the question (no patient to interview): their vignette is empty
    empty_vignettes: list[str] = field(default_factory=list)
    #: MediQ's atomic facts: {"source": describe(), "rule": text, "files": {file: {lines, matched}}, "cases": int}
    facts: dict | None = None
    files: dict[str, dict] = field(default_factory=dict)  # relative path -> {sha256, bytes}
    seconds: float = 0.0
    #: the golden consultations (consult_train): {"rows", "by_writer", "inputs", "reasons", "no_facts", "dropped",
    #: "decontamination", "writer": {"model", "asked", "written", "failed": {case: why}} | None}
    consult_train: dict | None = None
    #: the CRAFT-MD training cases (craftmd_train): {"candidates", "rows", "reasons", "dropped", "decontamination"}
    craftmd_train: dict | None = None
    #: what the training configs were kept apart from: {"tasks": {task: its test cases}, "not_checked": {task: why},
    #: "against": [the other dataset folders read, by name]}
    benchmark: dict | None = None

    def summary(self) -> str:
        """A few lines for the terminal."""
        lines = [
            f"built CRAFT-MD dataset {self.version} from {self.source['location']} "
            f"(commit {self.source['commit'][:12]}, content {self.source['content_sha256'][:12]}) in {self.seconds:.1f} s",
            "rows: " + ", ".join(f"{c} {n:,}" for c, n in self.rows.items()),
            f"question split agrees with upstream on {self.split.agreeing:,}/{self.split.compared:,} cases "
            f"({100 * self.split.agreement:.2f} %); {len(self.split.disagreements)} listed in build_report.md",
            f"stray closing quotes removed from {len(self.cleaned['answers'])} answers and "
            f"{self.cleaned['choice_values']} choices ({len(self.cleaned['choice_cases'])} cases)",
            f"MedQA rule recall on the upstream picks: {self.medqa_rule['kept']:,}/{self.medqa_rule['picks']:,} "
            f"({100 * self.medqa_rule['recall']:.2f} %)",
        ]
        if self.empty_vignettes:
            lines.append(f"empty vignette (the source item is only a question): {', '.join(self.empty_vignettes)}")
        if self.facts:
            lines.append(self.facts_line())
        if self.medqa_file:
            lines.append(
                f"medqa_usmle from {self.medqa_file['path']}: {self.medqa_file['picked']:,} of {self.medqa_file['items']:,} items picked"
            )
        if self.benchmark:
            lines.append(self.benchmark_line())
        if self.consult_train:
            lines.append(self.consult_train_line())
        if self.craftmd_train:
            lines.append(self.craftmd_train_line())
        return "\n".join(lines)

    def benchmark_line(self) -> str:
        """The tasks whose test cases the training configs were kept apart from, and those not at hand, one line."""
        b = self.benchmark
        line = "training configs kept apart from the test cases of " + ", ".join(f"{t} ({n:,})" for t, n in b["tasks"].items())
        if b["not_checked"]:
            line += "; not checked against " + "; ".join(
                f"{t} ({why}: build them and pass --against DIR)" for t, why in b["not_checked"].items()
            )
        return line

    def craftmd_train_line(self) -> str:
        """The CRAFT-MD training cases, one line."""
        t = self.craftmd_train
        return (
            f"craftmd_train (split train): {t['rows']:,} training vignettes of {t['candidates']:,} candidates; "
            f"{len(t['dropped'])} dropped as benchmark cases{_by_task(t['dropped'], ': ')} (listed in build_report.md)"
        )

    def _craftmd_train_markdown(self) -> list[str]:
        t = self.craftmd_train
        return [
            "",
            "## CRAFT-MD training cases (`craftmd_train`, split `train`)",
            "",
            self.craftmd_train_line() + ".",
            "",
            *_rule_lines(t),
            *_dropped_lines(t),
        ]

    def consult_train_line(self) -> str:
        """The golden consultations, one line (with the model writer's failures counted)."""
        t = self.consult_train
        by = ", ".join(f"{w} {n:,}" for w, n in t["by_writer"].items()) or "none"
        line = (
            f"consult_train (split train): {t['rows']:,} golden consultations ({by}); "
            f"{len(t['dropped'])} candidates dropped as benchmark cases{_by_task(t['dropped'], ': ')} (listed in build_report.md)"
        )
        w = t.get("writer")
        if w:
            line += f"; {w['model']} wrote {w['written']:,} of {w['asked']:,}, {len(w['failed'])} failed (listed)"
        return line

    def facts_line(self) -> str:
        """The MediQ match count, one line."""
        per = "; ".join(f"{Path(f).name} {c['matched']:,} of {c['lines']:,} lines" for f, c in self.facts["files"].items())
        return f"MediQ atomic facts (facts config) for {self.facts['cases']:,} cases: {per} matched"

    def _consult_train_markdown(self) -> list[str]:
        t = self.consult_train
        md = [
            "",
            "## Golden consultations (`consult_train`, split `train`)",
            "",
            self.consult_train_line() + ".",
            "",
            "Inputs: " + "; ".join(f"{k} {v:,} lines" for k, v in t["inputs"].items()) + ".",
            "",
            *_rule_lines(t),
        ]
        if t["no_facts"]:
            md += [
                "",
                f"Candidates with fewer than two facts (nothing to ask after the initial request), left out: {', '.join(t['no_facts'])}",
            ]
        md += _dropped_lines(t)
        w = t.get("writer")
        if w:
            md += [
                "",
                f"Model-written dialogues: writer `{w['model']}`, prompt set `{w['prompt_set']}`; {w['written']:,} of "
                f"{w['asked']:,} written. Failures ({len(w['failed'])}):",
                "",
            ]
            md += [f"- {case}: {_cell(why)}" for case, why in w["failed"].items()] or ["- none"]
        return md

    def to_markdown(self) -> str:
        md = self._counts_markdown() + self._answers_markdown() + self._split_markdown() + self._medqa_markdown()
        if self.facts:
            md += [
                "",
                "## MediQ atomic facts",
                "",
                self.facts_line() + ".",
                "",
                f"Source: `{self.facts['source']['location']}`, commit `{self.facts['source']['commit']}`, content sha256 "
                f"`{self.facts['source']['content_sha256']}`. Match rule: {self.facts['rule']}.",
            ]
        if self.benchmark:
            md += ["", "## What the training configs are kept apart from", "", self.benchmark_line() + "."]
        if self.consult_train:
            md += self._consult_train_markdown()
        if self.craftmd_train:
            md += self._craftmd_train_markdown()
        md += [
            "",
            "## NEJM image cases",
            "",
            f"{self.nejm['rows']} GPT-4V result files, one image each (decoded from the first image of the recorded messages).",
        ]
        if self.nejm["multi_image"]:
            md.append(
                "Files whose trials carry more than one distinct image (the first is used): "
                + ", ".join(self.nejm["multi_image"])
            )
        md += ["", "## Files", "", "| file | bytes | sha256 |", "|---|---:|---|"]
        md += [f"| {p} | {f['bytes']:,} | `{f['sha256']}` |" for p, f in self.files.items()]
        return "\n".join(md) + "\n"

    def _counts_markdown(self) -> list[str]:
        def table(title: str, counts: dict, head=("value", "rows")) -> list[str]:
            out = [f"### {title}", "", f"| {head[0]} | {head[1]} |", "|---|---:|"]
            out += [f"| {k} | {v:,} |" for k, v in counts.items()]
            return out + [""]

        md = [
            f"# Build report: CRAFT-MD dataset {self.version}",
            "",
            f"- Source: `{self.source['location']}`, commit `{self.source['commit']}`, content sha256 `{self.source['content_sha256']}`",
            f"- Builder: craftmd {self.version}",
            "",
            "## Counts",
            "",
        ]
        md += table("Rows per config", self.rows, ("config", "rows"))
        md += table("Text cases per source", self.by_source, ("source", "cases"))
        md += table("Text cases per specialty", self.by_specialty, ("specialty", "cases"))
        md += table("Text cases per task type", self.by_task_type, ("task type", "cases"))
        md += table("single_dx (dermatologists' QC label)", self.single_dx, ("single_dx", "cases"))
        md += [
            "`single_dx` comes from `results/expert_annotations/case_vignette_qc.csv` (one row per derm vignette): "
            "true when the answer is the only possible diagnosis, or else still the single most likely one; false "
            "when neither; null for MedQA (not annotated).",
            "",
        ]
        return md

    def _answers_markdown(self) -> list[str]:
        md = []
        if self.answers_renamed:
            md += [
                "Answers written as a synonym of their choice (the choice's text is used): " + ", ".join(self.answers_renamed),
                "",
            ]
        c, k = self.cleaned, self.paper_key
        md += [
            "## Answers and the paper's answer key",
            "",
            f'Stray closing quotes (the CSV\'s `"` after a line break, e.g. `Osteosarcoma "`) removed from '
            f"**{len(c['answers'])} answers** and **{c['choice_values']} choices ({len(c['choice_cases'])} cases)**; "
            "`answer` is still the choice at `answer_index`.",
            "",
            "Answers: " + (", ".join(c["answers"]) or "none"),
            "",
            "Cases with a cleaned choice: " + (", ".join(c["choice_cases"]) or "none"),
            "",
            f"`paper_answer` (the key the paper's MCQ rule used, kept verbatim for reproduction) comes from the "
            f"results files' `correct_ans` for {k['from_results']:,} cases and from the CSV's answer, lower-cased, "
            f"for {k['from_csv']:,}. It differs from the lower-cased `answer` in {len(k['differs'])} cases "
            "(trailing spaces or line breaks, a stray quote, a synonym): " + (", ".join(k["differs"]) or "none"),
            "",
        ]
        return md

    def _split_markdown(self) -> list[str]:
        s = self.split
        md = [
            "## Question split",
            "",
            f"Our `vignette` equals upstream's `case_vignette` (results/gpt4_1106, whitespace normalised) for "
            f"**{s.agreeing:,} of {s.compared:,} cases ({100 * s.agreement:.2f} %)**. The cases that differ:",
            "",
            "| case | our question sentence | upstream's question | why |",
            "|---|---|---|---|",
        ]
        for d in s.disagreements:
            md.append(f"| {d['case_id']} | {_cell(d['ours_question'])} | {_cell(d['upstream_question'])} | {_cell(d['why'])} |")
        md += [
            "",
            f'{len(self.colon_stems)} MedQA cases end with a stem closed by ":" instead of a question mark; as upstream, '
            "the stem stays in the vignette and the case is asked the default question: " + ", ".join(self.colon_stems),
            "",
            f"{len(self.empty_vignettes)} cases have an empty `vignette` because their source text is only the question "
            "(upstream's `case_vignette` holds the question sentence and nothing before it; the patients are in the "
            "choices): " + (", ".join(self.empty_vignettes) or "none") + ". They are kept, as upstream counted them; "
            "their conversations have no case to tell.",
            "",
        ]
        return md

    def _medqa_markdown(self) -> list[str]:
        md = [
            "## MedQA filter",
            "",
            f"The rule (`craftmd.dataset_builder.medqa.select`) keeps **{self.medqa_rule['kept']:,} of the "
            f"{self.medqa_rule['picks']:,} upstream picks (recall {100 * self.medqa_rule['recall']:.2f} %)**. "
            "Verdicts on the picks:",
            "",
        ]
        md += [f"- {reason}: {n:,}" for reason, n in self.medqa_rule["reasons"].items()]
        md += ["", "Every pick it drops:", "", "| case | reason | question |", "|---|---|---|"]
        md += [f"| {cid} | {reason} | {_cell(q)} |" for cid, reason, q in self.medqa_rule["dropped"]]
        if self.medqa_file:
            md += [
                "",
                f"### `--medqa {self.medqa_file['path']}`",
                "",
                f"{self.medqa_file['picked']:,} of {self.medqa_file['items']:,} items picked; verdicts:",
                "",
            ]
            md += [f"- {reason}: {n:,}" for reason, n in self.medqa_file["reasons"].items()]
        return md


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _rule_lines(t: dict) -> list[str]:
    """A training config's diagnosis-rule verdicts per source (markdown lines)."""
    return [
        "Diagnosis rule (the MedQA filter) on the candidates that are no benchmark case:",
        "",
        *(f"- {src}: " + "; ".join(f"{r} {n:,}" for r, n in reasons.items()) for src, reasons in t["reasons"].items()),
    ]


def _dropped_lines(t: dict) -> list[str]:
    """A training config's decontamination and the candidates it dropped as benchmark cases (markdown lines)."""
    return [
        "",
        f"Decontamination: {t['decontamination']}. Dropped ({len(t['dropped'])}{_by_task(t['dropped'], ': ')}):",
        "",
        "| candidate | nearest benchmark case | its tasks | similarity | n-gram share |",
        "|---|---|---|---:|---:|",
        *(f"| {d['case']} | {d['benchmark_case']} | {', '.join(d.get('tasks', ()))} | {d['similarity']:.4f} | {d['ngram_share']:.4f} |"
          for d in t["dropped"]),
    ]  # fmt: skip


def _by_task(dropped: list[dict], before: str = " (", after: str = "") -> str:
    """The dropped candidates per task whose test case they are (a case two tasks pose counts for both), ``task N, ...``
    between ``before`` and ``after``; "" when none is dropped."""
    counts = Counter(t for d in dropped for t in d.get("tasks", ()))
    return before + ", ".join(f"{t} {n:,}" for t, n in counts.items()) + after if counts else ""
