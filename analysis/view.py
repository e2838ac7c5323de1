"""What the page and the figures show, looked up from an analysis' tables.

Which FRQ grader stands behind a model's free-response figures is the scorer registry's
call (:func:`craftmd.scoring.scorers.rank_frq`): of the graders that graded the release,
the one whose agreement with people was measured highest; a grader that graded its own
model (recorded ``self_graded``) never stands there, so such a release has no FRQ figure on
the board and cannot lead it.
"""

from __future__ import annotations

import json
from collections import Counter

import polars as pl

from craftmd.release import Protocol, protocol_differences
from craftmd.scoring.scorers import rank_frq
from craftmd.tasks import in_order

#: The conversations the history section and figures read: standard text conversations.
HISTORY_VARIANT = "conversation=standard"

UPSTREAM_SETTINGS = ("vignette", "multiturn", "singleturn", "summarized")
SETTING_LABELS = {
    "vignette": "Vignette",
    "multiturn": "Multi-turn",
    "singleturn": "Single-turn",
    "summarized": "Summarized",
    "exam": "Exam only",
    "multiturn_no_exam": "Multi-turn, no exam",
    "multiturn_plus_exam": "Multi-turn + exam",
}
SETTING_NOTES = {
    "vignette": "The whole case vignette is given to the model at once, then the question is asked: the exam-style setting.",
    "multiturn": "The model, as doctor, interviews a patient-AI that holds the vignette, one question at a time; the "
    "question is then asked about the conversation (its final-diagnosis turn removed). The paper's recommended measure.",
    "singleturn": "Only the patient's first turn (the presenting complaint) is given.",
    "summarized": "A third-person summary of the patient's side of the conversation is given instead of the dialogue.",
}


def main_tasks(a) -> list:
    """The tasks of the analysed releases whose releases are the page's main board (:attr:`craftmd.tasks.Analysis.main`)."""
    return [t for t in in_order(a.releases["task"].to_list()) if t.analysis.main]


def board_columns(a) -> list:
    """The main board's columns (:attr:`craftmd.tasks.Analysis.columns`, :class:`craftmd.tasks.Measure`) of the main
    board's tasks, in their order, each once: the first leads (it ranks the board)."""
    return list(dict.fromkeys(c for t in main_tasks(a) for c in t.analysis.columns))


def conversational(tasks) -> set[str]:
    """The settings of ``tasks`` whose question reads a conversation (CRAFT-MD's multiturn, singleturn, summarized, ...)."""
    return {e.setting for t in tasks for e in t.experiments if e.conversation}


FORMAT_LABELS = {"mcq4": "MCQ (4 choices)", "mcq_many": "MCQ (many choices)", "frq": "FRQ", "top3": "Top-3"}
MCQ_PRIMARY = "paper"


def protocol(key: str | None) -> Protocol | None:
    """A protocol from its key (the releases frame's ``protocol`` column: :meth:`Protocol.key`); None: unknown."""
    return Protocol.model_validate_json(key) if key else None


def reference_protocol(keys: dict[str, str | None], preferred=()) -> str | None:
    """The protocol a board ranks by, of ``keys`` (release -> protocol key): the one most of the ``preferred`` releases
    ran (the upstream releases: the paper's runs), else the one most releases ran; ties go to the first key in order."""
    among = [keys[m] for m in preferred if m in keys] or list(keys.values())
    counts = Counter(k for k in among if k is not None)
    return min(counts, key=lambda k: (-counts[k], k)) if counts else None


def protocol_groups(keys: dict[str, str | None], reference: str | None) -> list[tuple[str | None, list[str]]]:
    """The protocols besides ``reference`` of ``keys`` (release -> protocol key), each with why it is not comparable
    with the reference, in words (:func:`craftmd.release.protocol_differences`), in the order of those words."""
    others = {k for k in keys.values() if k != reference} if reference is not None else {k for k in keys.values() if k}
    return sorted(((k, protocol_differences(protocol(k), protocol(reference))) for k in others), key=lambda g: (g[1], g[0] or ""))


def describe_protocol(key: str | None) -> str:
    """A protocol in words, for the release list: task and version, prompt set, roles, trials, recorded grader."""
    p = protocol(key)
    if p is None:
        return "unknown protocol (the release states none)"
    parts = [f"{p.task} v{p.version}" if p.version is not None else f"{p.task} (version not recorded)"]
    if p.prompt_set is not None:
        parts.append(f"prompts {p.prompt_set.name}" + (f" ({p.prompt_set.sha256[:12]})" if p.prompt_set.sha256 else ""))
    parts += [f"{role} {model}" for role, model in p.roles.items()]
    if p.trials is not None:
        parts.append(f"{p.trials} trials")
    if p.grader is not None:
        parts.append(f"FRQ graded by {p.grader.name}" + (f" ({p.grader.prompt_set.name})" if p.grader.prompt_set else ""))
    return ", ".join(parts)


def task_references(a, v: View | None = None) -> dict[str, str | None]:
    """Each task's reference protocol (the one its board ranks by): the main board's is the :class:`View`'s (the paper's
    runs'), another task's the one most of its releases ran."""
    info = list(a.releases.iter_rows(named=True))
    main = {t.name for t in main_tasks(a)}
    out = {}
    for task in sorted({r["task"] for r in info}):
        keys = {r["release"]: r["protocol"] for r in info if r["task"] == task}
        out[task] = ((v or View.of(a)).reference if task in main else None) or reference_protocol(keys)
    return out


def protocol_table(a) -> pl.DataFrame:
    """``tables/protocols.csv``: each release's protocol (in words and as JSON), whether it is its task's board's (a
    CRAFT-MD run that showed the doctor images: the image table's, :attr:`View.image_reference`), and if not, why, in
    words."""
    v = View.of(a)
    refs = task_references(a, v)
    rows = []
    for r in a.releases.sort("release").iter_rows(named=True):
        p = protocol(r["protocol"])
        images = p is not None and p.images  # only a task whose jobs show images records it (CRAFT-MD's NEJM cases)
        why = protocol_differences(p, protocol(v.image_reference if images else refs.get(r["task"])))
        rows.append({"release": r["release"], "display": r["display"], "task": r["task"], "comparable": not why,
                     "not_comparable_because": "; ".join(why), "protocol": describe_protocol(r["protocol"]),
                     "protocol_json": r["protocol"]})  # fmt: skip
    schema = {"release": pl.String, "display": pl.String, "task": pl.String, "comparable": pl.Boolean,
              "not_comparable_because": pl.String, "protocol": pl.String, "protocol_json": pl.String}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


class View:
    """The page's and figures' questions, answered from an analysis.

    ``models`` are the releases ranked on the board: every text release that covers the
    board's case set (the most cases any text release covers), best first by the leading
    measure. ``partial`` are the text releases that cover fewer cases: they are listed
    apart, never ranked among the complete ones. ``other_protocols`` are the releases whose protocol is not the
    board's (the upstream releases', the paper's: :attr:`reference`), one table per protocol with why, in words; they
    are never ranked with the board nor tested against it. ``self_reported`` are the submissions that
    answer conversational settings (multi-turn, single-turn, summarized, ...) without the
    conversations behind them: nothing shows those answers came from a conversation, so
    they are listed apart as self-reported, never ranked, never the board's case set. Case
    counts per group come from the dataset (``group_sizes``), never from a release.
    """

    @classmethod
    def of(cls, a) -> View:
        """The view of analysis ``a``, made once: the tables, the figures, the boards and the page all ask this one."""
        v = a.__dict__.get("_view")
        if v is None or v.a is not a:
            v = a.__dict__["_view"] = cls(a)
        return v

    def __init__(self, a):
        self.a = a
        acc = a.accuracy
        self._acc = {
            (r["model"], r["setting"], r["format"], r["grader"], r["with_image"], r["group_by"], r["group"]): r
            for r in acc.iter_rows(named=True)
        }
        #: the main board's columns, declared by its tasks (:func:`board_columns`): the first leads and ranks the board
        self.columns = board_columns(a)
        rel = a.releases
        self.release_info = {r["release"]: r for r in rel.iter_rows(named=True)}
        #: per release, the graders that graded its own model (allowed with --allow-self, never ranked by)
        self.self_graded: dict[str, set[str]] = {
            m: {g for g, rec in json.loads(r.get("scorers") or "{}").items() if rec.get("self_graded")}
            for m, r in self.release_info.items()
        }
        # FRQ grader per (release, with_image): the registry's best, never a self-grader
        self.frq_grader: dict[tuple[str, bool], str] = {}
        frq = acc.filter(pl.col("format") == "frq", pl.col("group_by") == "all").select("model", "with_image", "grader").unique()
        by_cell: dict[tuple[str, bool], list[str]] = {}
        for m, img, g in frq.iter_rows():
            by_cell.setdefault((m, img), []).append(g)
        for (m, img), graders in sorted(by_cell.items()):
            own = self.self_graded.get(m, set())
            best = rank_frq(graders, self_graders=own)[0]
            if best not in own:
                self.frq_grader[(m, img)] = best
        #: the releases of the main board's tasks (CRAFT-MD's): the only ones its board, sections and figures show (another
        #: task's releases have their own sections and a row in the board per task, analysis.boards)
        main = main_tasks(a)
        own = {m for m, r in self.release_info.items() if r.get("task") in {t.name for t in main}}
        text_models = sorted(
            ({m for (m, img) in by_cell if not img} | set(acc.filter(~pl.col("with_image"))["model"].unique().to_list())) & own
        )
        #: submissions that answer conversational settings with no conversations behind them: self-reported, never ranked
        answered = acc.filter(~pl.col("with_image")).group_by("model").agg(pl.col("setting").unique())
        settings_of = {m: set(s) for m, s in answered.iter_rows()}
        self_reported = {
            m for m in text_models if self.self_reported_release(m) and settings_of.get(m, set()) & conversational(main)
        }
        text_models = [m for m in text_models if m not in self_reported]
        #: each release's protocol (its key; None: unknown) and the board's: the one the upstream releases (the paper's
        #: runs) ran, else the one most releases ran. Releases of another protocol are never ranked with the board's:
        #: each protocol is its own table (:attr:`other_protocols`), with why it is not comparable, in words
        self.protocol = {m: r.get("protocol") for m, r in self.release_info.items()}
        upstream = [m for m in text_models if self.kind(m) == "upstream"]
        self.reference = reference_protocol({m: self.protocol[m] for m in text_models}, upstream)
        self.reference_is_paper = bool(upstream) and self.reference == reference_protocol({m: self.protocol[m] for m in upstream})
        apart = {m for m in text_models if self.protocol[m] != self.reference}
        overall = acc.filter(~pl.col("with_image"), pl.col("group_by") == "all")
        covered = dict(overall.group_by("model").agg(pl.col("n_cases").max()).iter_rows())
        #: cases of the board's case set that each text release has scores for (its widest cell)
        self.coverage: dict[str, int] = {m: int(covered.get(m) or 0) for m in text_models}
        #: the board's case set: what the complete text releases cover
        self.board_cases = max(self.coverage.values(), default=0)
        ranked = sorted(text_models, key=lambda m: (-self._lead(m), self.display(m)))
        self.models = [m for m in ranked if self.coverage[m] == self.board_cases and m not in apart]
        #: the other protocols, each {"protocol": key, "reasons": [words], "models": its releases, ranked among themselves}
        self.other_protocols = [
            {"protocol": k, "reasons": why, "models": [m for m in ranked if m in apart and self.protocol[m] == k]}
            for k, why in protocol_groups({m: self.protocol[m] for m in apart}, self.reference)
        ]
        self.apart = apart
        self.partial = sorted(
            (m for m in ranked if self.coverage[m] < self.board_cases and m not in apart),
            key=lambda m: (-self.coverage[m], -self._lead(m), self.display(m)),
        )
        self.self_reported = sorted(self_reported, key=lambda m: (-self._lead(m), self.display(m)))
        self.image_models = sorted({r["model"] for r in acc.filter(pl.col("with_image")).iter_rows(named=True)} & own)
        #: the image table's protocol: the one the upstream image releases ran (GPT-4V's recorded run, upstream's
        #: multimodal path), else the one most image releases ran; an image release of another protocol is listed with
        #: why it is not comparable, in words (:attr:`image_apart`), never beside it silently
        image_upstream = [m for m in self.image_models if self.kind(m) == "upstream"]
        self.image_reference = reference_protocol({m: self.protocol[m] for m in self.image_models}, image_upstream)
        self.image_reference_is_paper = bool(image_upstream) and self.image_reference == reference_protocol(
            {m: self.protocol[m] for m in image_upstream}
        )
        self.image_apart: dict[str, list[str]] = {
            m: why
            for m in self.image_models
            if (why := protocol_differences(protocol(self.protocol[m]), protocol(self.image_reference)))
        }
        self._sizes = {(r["with_image"], r["group_by"], r["group"]): r["n_cases"] for r in a.group_sizes.iter_rows(named=True)}
        self.specialties = sorted(self.groups("specialty"), key=lambda s: (s == "Other", s))
        self.frq_graders_all = rank_frq(acc.filter(pl.col("format") == "frq")["grader"].unique().to_list())

    def self_reported_release(self, m: str) -> bool:
        """A submission that brought no conversations (its run record names no conversations file)."""
        info = self.release_info.get(m)
        return (
            bool(info) and info["kind"] == "submission" and not json.loads(info.get("source") or "{}").get("conversations_file")
        )

    def history_cell(self, m: str, metric: str) -> dict | None:
        """The history scorer's row of ``tables/metrics.csv`` for release ``m``'s standard text conversations."""
        if not hasattr(self, "_history"):
            mt = self.a.metrics.filter(
                pl.col("scorer") == "history",
                pl.col("variant").str.contains(HISTORY_VARIANT),
                pl.col("variant").str.contains("with_image=false"),
            )
            self._history = {(r["model"], r["metric"]): r for r in mt.iter_rows(named=True)}
        return self._history.get((m, metric))

    def column(self, m: str, column) -> dict | None:
        """Release ``m``'s cell in a column of the main board (:attr:`columns`)."""
        return self.cell(m, column.setting, column.format, grader=column.grader)

    def _lead(self, m: str) -> float:
        r = self.column(m, self.columns[0]) if self.columns else None
        return r["accuracy"] if r else -1.0

    def display(self, m: str) -> str:
        info = self.release_info.get(m)
        return info["display"] if info else m

    def kind(self, m: str) -> str:
        info = self.release_info.get(m)
        return info["kind"] if info else ""

    def notes(self, m: str) -> dict:
        info = self.release_info.get(m)
        return json.loads(info["notes"]) if info else {}

    def counts(self, m: str) -> dict:
        info = self.release_info.get(m)
        return json.loads(info["counts"]) if info else {}

    def grader_for(self, m: str, fmt: str, with_image: bool = False) -> str | None:
        if fmt == "frq":
            return self.frq_grader.get((m, with_image))
        return MCQ_PRIMARY

    def cell(self, m, setting, fmt, grader=None, with_image=False, group_by="all", group="all") -> dict | None:
        g = grader or self.grader_for(m, fmt, with_image)
        if g is None:
            return None
        return self._acc.get((m, setting, fmt, g, with_image, group_by, group))

    def group_size(self, group_by: str = "all", group: str = "all", with_image: bool = False) -> int:
        """How many of the dataset's cases the group holds (0 for a group the dataset does not have)."""
        return self._sizes.get((with_image, group_by, group), 0)

    def groups(self, group_by: str, with_image: bool = False) -> list[str]:
        """The dataset's groups of one kind (``specialty``, ``dataset``, ``single_dx``), sorted."""
        return sorted(g for (img, gb, g) in self._sizes if img == with_image and gb == group_by)

    def n_cases(self, specialty: str) -> int:
        return self.group_size("specialty", specialty)

    @staticmethod
    def format_label(fmt: str) -> str:
        return FORMAT_LABELS.get(fmt, fmt)


__all__ = [
    "View",
    "protocol",
    "reference_protocol",
    "protocol_groups",
    "describe_protocol",
    "protocol_table",
    "task_references",
    "board_columns",
    "SETTING_LABELS",
    "SETTING_NOTES",
    "UPSTREAM_SETTINGS",
    "FORMAT_LABELS",
]
