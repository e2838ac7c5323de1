"""Upstream results -> frozen releases.

Each upstream ``results/<model>/case_<n>.json`` folder of the pinned source becomes a
release ``OUT/<model>/`` (see :mod:`craftmd.release`), read once through
:class:`craftmd.source.Source` and written atomically:

* ``conversations``: the recorded doctor-patient conversation of every trial, as the
  doctor saw it (the patient speaks as ``user``), text only: GPT-4V's messages carry
  base64 images, whose text parts are kept and image bytes dropped (``with_image``
  marks those rows); the summary, the number of doctor turns and how it ended.
* ``answers``: vignette / multiturn / singleturn / summarized x ``mcq4`` / ``frq`` per
  trial. A missing answer (``missing``) or one that is not a string (``non_text``)
  stays a row with a null response, counted in the manifest, never dropped.
* ``scores``: the MCQ rules ``paper`` and ``strict`` (:mod:`craftmd.scoring.mcq`) on
  ``mcq4``, and upstream's recorded GPT-4 grader labels on ``frq`` as the scorer
  ``upstream-gpt4`` (1 correct, 0 wrong, -1 no diagnosis), all as ``correct`` scores. The NEJM Image Challenge
  cases (``gpt4v``) have no choices in the source, so their MCQ answers are kept but
  not graded by rule; the manifest says so.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from craftmd import CraftMDError
from craftmd.dataset import config_file
from craftmd.release import GraderRef, PromptRef, Protocol, RunRecord, read_release, sha256_file, write_release
from craftmd.scoring.grade import grader_identity
from craftmd.scoring.scorers import dataset_inputs, load_cases
from craftmd.scoring.mcq import RULES_VERSION, answer_rules, grade_mcq
from craftmd.scoring.scorers import RECORDED, Verdict, ScoreRows
from craftmd.source import PINNED_COMMIT, Source

#: Bump when what ingest writes changes; a release of another version is re-ingested.
INGEST_VERSION = 2  # 2: paper grades the dataset's paper_answer; strict the cleaned answer
UPSTREAM_SETTINGS = ("vignette", "multiturn", "singleturn", "summarized")
UPSTREAM_FORMATS = {"mcq": "mcq4", "frq": "frq"}
PATIENT_AND_GRADER = "openai/gpt-4-1106-preview"
#: Upstream's summarizer: src/utils.py convert_to_summarized calls call_gpt3_api (deployment gpt31106).
SUMMARIZER = "openai/gpt-3.5-turbo-1106"
#: Trials per case in upstream's results (trial_0..trial_4).
UPSTREAM_TRIALS = 5
#: The version of the craftmd task whose protocol is upstream's code at the pinned commit (CHANGELOG.md, "Changes that
#: move scores"): the upstream releases ran it, whatever the task's version is now. 2: an image job speaks upstream's
#: multimodal path (GPT-4V's recorded run), as the text jobs speak its text path.
UPSTREAM_TASK_VERSION = 2
#: The prompt sets of upstream's code at the pinned commit, as the package names them (its CRAFT-MD generation prompts,
#: and its grader-AI's two prompts), with the src/prompts.py functions each is read from.
UPSTREAM_PROMPT_SET = f"craftmd-upstream-{PINNED_COMMIT[:7]}"
UPSTREAM_GRADER_PROMPT_SET = f"grader-upstream-{PINNED_COMMIT[:7]}"
UPSTREAM_PROMPTS = (
    "get_doctor_prompt",
    "get_patient_prompt",
    "convert_to_summarized_prompt",
    "get_vignette_mcq_prompt",
    "get_vignette_frq_prompt",
    "get_mcq_after_conversation_prompt",
    "get_frq_after_conversation_prompt",
    "get_doctor_prompt_multimodal",
    "get_vignette_mcq_prompt_multimodal",
    "get_vignette_frq_prompt_multimodal",
)
UPSTREAM_GRADER_PROMPTS = ("get_extract_diagnosis_name_prompt", "get_diagnosis_evaluation_prompt")


@dataclass(frozen=True)
class UpstreamModel:
    release: str  # upstream's folder name, the release id
    model: str  # provider/model
    display: str  # the name the paper uses
    with_image: bool = False  # NEJM Image Challenge cases, image shown to the doctor


UPSTREAM_MODELS = {
    m.release: m
    for m in (
        UpstreamModel("gpt4_1106", "openai/gpt-4-1106-preview", "GPT-4"),
        UpstreamModel("gpt3_1106", "openai/gpt-3.5-turbo-1106", "GPT-3.5"),
        UpstreamModel("mistral-v1", "mistralai/Mistral-7B-Instruct-v0.1", "Mistral-v1"),
        UpstreamModel("mistral-v2", "mistralai/Mistral-7B-Instruct-v0.2", "Mistral-v2"),
        UpstreamModel("llama2-7b", "meta-llama/Llama-2-7b-chat-hf", "LLaMA-2-7b"),
        UpstreamModel("gpt4v", "openai/gpt-4-vision-preview", "GPT-4V", with_image=True),
    )
}
_FILE = re.compile(r"^results/([^/]+)/(case_\d+)\.json$")


def upstream_prompt_ref(name: str, functions: tuple[str, ...]) -> PromptRef:
    """Prompt set ``name``: upstream's ``functions`` of src/prompts.py, identified by the sha256 the package's prompt set
    of that name records when it runs (the CRAFT-MD task's folder of that name: its files and what it renders from), so
    a run made here with it has the upstream releases' prompt set; a set that is no folder of the task (the grader-AI's)
    by the sha256 of upstream's parsed templates (:mod:`craftmd.upstream_prompts`)."""
    from craftmd.generation.protocol import PromptSet
    from craftmd.tasks import declaring
    from craftmd.upstream_prompts import upstream_prompts_sha256

    root = declaring("upstream").protocol.prompts_root
    if (root / name).is_dir():
        return PromptRef(name=name, sha256=PromptSet(name, root).sha256)
    return PromptRef(name=name, sha256=upstream_prompts_sha256(functions))


def upstream_protocol(images: bool = False) -> Protocol:
    """The protocol of the upstream releases: upstream's code at the pinned commit (its prompts; GPT-4 as patient,
    GPT-3.5 as summarizer; 5 trials), their free response graded by upstream's GPT-4 grader-AI with its two prompts.
    It is the board's reference: the paper's runs. Its task is the one that declares upstream's results its own
    (:attr:`craftmd.tasks.Task.upstream`: CRAFT-MD's). ``images``: GPT-4V's run (upstream's multimodal path, the NEJM
    cases' images shown to the doctor), the reference of the image cases' table."""
    from craftmd.tasks import declaring

    task = declaring("upstream")
    return Protocol(
        task=task.name,
        version=UPSTREAM_TASK_VERSION,
        prompt_set=upstream_prompt_ref(UPSTREAM_PROMPT_SET, UPSTREAM_PROMPTS),
        roles={"patient": PATIENT_AND_GRADER, "summarizer": SUMMARIZER},
        images=images,
        answer_rules=answer_rules(task),
        trials=UPSTREAM_TRIALS,
        grader=GraderRef(
            name=RECORDED,
            model=PATIENT_AND_GRADER,
            prompt_set=upstream_prompt_ref(UPSTREAM_GRADER_PROMPT_SET, UPSTREAM_GRADER_PROMPTS),
        ),
    )


def _text(content) -> tuple[str, bool]:
    """Message content -> (text, had_image). Content parts keep their text, drop images."""
    if isinstance(content, str):
        return content, False
    if isinstance(content, list):
        texts, image = [], False
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "image_url":
                image = True
        return "\n".join(texts), image
    return "" if content is None else str(content), False


def _ended(messages: list[dict]) -> str:
    """How a recorded conversation stopped: the doctor gave a diagnosis, stopped asking, or ran out of turns."""
    last = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), None)
    if last is None:
        return "no_question"
    if "final diagnosis" in last.lower():
        return "final_diagnosis"
    if "?" not in last:
        return "no_question"
    return "max_turns"


class _Release:
    """Columns of one release, filled file by file."""

    def __init__(self, spec: UpstreamModel, cases: dict[str, tuple[list[str], str, str]]):
        self.spec = spec
        self.cases = cases
        self.conv = {k: [] for k in ("case_id", "trial", "messages", "summary", "n_turns", "ended")}
        self.ans = {k: [] for k in ("case_id", "trial", "setting", "format", "response", "status")}
        self.scores = ScoreRows()
        self.n_files = 0
        self.images_dropped = 0
        self.status_by_cell: dict[str, Counter] = {}

    def _grade(self, case_id, trial, setting, fmt, grader, resolved, kind, correct, detail=None):
        row = {"case_id": case_id, "trial": trial, "setting": setting, "format": fmt, "with_image": self.spec.with_image}
        self.scores.add(row, grader, Verdict(resolved, kind, correct, detail))

    def add(self, path: str, case_id: str, data: bytes) -> None:
        try:
            d = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CraftMDError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(d, dict) or d.get("case_id", case_id) != case_id:
            raise CraftMDError(
                f"{path}: case_id {d.get('case_id') if isinstance(d, dict) else None!r} does not match the file name"
            )
        if self.spec.with_image:  # NEJM Image Challenge case ids: no choices in the source
            choices, answer, paper_answer = None, None, None
        elif case_id in self.cases:
            choices, answer, paper_answer = self.cases[case_id]
            # The dataset's paper_answer is this key; a results file that records another one
            # would be graded by a key the dataset does not carry.
            recorded = d.get("correct_ans")
            if isinstance(recorded, str) and recorded != paper_answer:
                raise CraftMDError(
                    f"{path}: correct_ans {recorded!r} is not the dataset's paper_answer {paper_answer!r} for {case_id}"
                )
        else:
            raise CraftMDError(f"{path}: {case_id} is not a case of the dataset")
        trials = sorted(int(k.split("_")[1]) for k in d if re.fullmatch(r"trial_\d+", k))
        if not trials:
            raise CraftMDError(f"{path}: no trial_<n> entries")
        self.n_files += 1
        for t in trials:
            rec = d[f"trial_{t}"]
            if not isinstance(rec, dict):
                raise CraftMDError(f"{path}: trial_{t} is not an object")
            self._conversation(path, case_id, t, rec)
            for setting in UPSTREAM_SETTINGS:
                for key, fmt in UPSTREAM_FORMATS.items():
                    raw = rec.get(f"{setting}_{key}")
                    if isinstance(raw, str) and raw.strip():
                        response, status = raw, "ok"
                    elif raw is None or isinstance(raw, str):
                        response, status = None, "missing"
                    else:
                        response, status = None, "non_text"
                    a = self.ans
                    a["case_id"].append(case_id)
                    a["trial"].append(t)
                    a["setting"].append(setting)
                    a["format"].append(fmt)
                    a["response"].append(response)
                    a["status"].append(status)
                    self.status_by_cell.setdefault(f"{setting}/{fmt}", Counter())[status] += 1
                    if fmt == "mcq4":
                        if choices:  # the NEJM image cases have none: not gradable by rule
                            for rule in ("paper", "strict"):
                                target = paper_answer if rule == "paper" else answer
                                resolved, kind, correct = grade_mcq(response, choices, target, rule)
                                self._grade(case_id, t, setting, fmt, rule, resolved, kind, correct)
                    else:
                        self._upstream_frq(case_id, t, setting, rec)

    def _upstream_frq(self, case_id: str, t: int, setting: str, rec: dict) -> None:
        ev = rec.get(f"evaluation_{setting}_frq")
        ex = rec.get(f"extracted_ans_{setting}_frq")
        ex = ex if isinstance(ex, str) else None
        if ev == -1 or ev is None or ex is None or ex.strip().lower() == "none":
            kind, resolved = "none", None
        elif ex.strip().lower() == "multiple":
            kind, resolved = "multiple", None
        else:
            kind, resolved = "single", ex
        detail = json.dumps({"evaluation": ev, "extracted_ans": ex}, ensure_ascii=False, sort_keys=True)
        self._grade(case_id, t, setting, "frq", RECORDED, resolved, kind, ev == 1, detail)

    def _conversation(self, path: str, case_id: str, t: int, rec: dict) -> None:
        msgs = rec.get("multiturn_conversation")
        if msgs is None:
            return
        if not isinstance(msgs, list):
            raise CraftMDError(f"{path}: trial_{t}.multiturn_conversation is not a list of messages")
        out = []
        for m in msgs:
            if not isinstance(m, dict) or "role" not in m:
                raise CraftMDError(f"{path}: trial_{t}.multiturn_conversation has a malformed message")
            text, image = _text(m.get("content"))
            self.images_dropped += image
            out.append({"role": str(m["role"]), "content": text})
        summary = rec.get("summarized_conversation")
        c = self.conv
        c["case_id"].append(case_id)
        c["trial"].append(t)
        c["messages"].append(out)
        c["summary"].append(summary if isinstance(summary, str) else None)
        c["n_turns"].append(sum(m["role"] == "assistant" for m in out))
        c["ended"].append(_ended(out))

    def tables(self) -> dict[str, pa.Table]:
        img = self.spec.with_image
        out = {}
        for name, cols in (("conversations", self.conv), ("answers", self.ans)):
            n = len(cols["case_id"])
            cols = dict(cols, with_image=[img] * n)
            if name == "conversations":
                cols["conversation"] = ["standard"] * n
            out[name] = pa.table(cols)
        return out

    def scorer_records(self, inputs: dict) -> dict[str, dict]:
        """Each scorer's record: identity, the inputs it scored, its counts."""
        per: dict[str, dict] = {}
        for g, v in zip(self.scores.cols["scorer"], self.scores.cols["value"]):
            e = per.setdefault(g, {"graded": 0, "correct": 0})
            e["graded"] += 1
            e["correct"] += v == 1.0
        out = {}
        for g, counts in per.items():
            ident = (
                {"recorded": f"results/{self.spec.release}/ evaluation_*_frq (GPT-4 grader-AI, as published)"}
                if g == RECORDED
                else grader_identity(g)
            )
            out[g] = dict(ident, **counts, inputs=inputs)
        return out

    def manifest(self, source: Source, dataset_sha: str | None) -> RunRecord:
        from craftmd.tasks import declaring

        task = declaring("upstream")
        status = Counter()
        for c in self.status_by_cell.values():
            status.update(c)
        not_ok = {
            cell: dict(sorted((k, v) for k, v in c.items() if k != "ok")) for cell, c in sorted(self.status_by_cell.items())
        }
        not_ok = {cell: v for cell, v in not_ok.items() if v}
        recorded_correct = sum(v == 1.0 for g, v in zip(self.scores.cols["scorer"], self.scores.cols["value"]) if g == RECORDED)
        notes = {
            "upstream_folder": f"results/{self.spec.release}/",
            "answers": "Missing or non-text upstream answers are kept as rows with a null response and status "
            "missing / non_text; every grader counts them wrong.",
            "mcq": "paper: the dataset's paper_answer (upstream's correct_ans, exactly as recorded) appears in the "
            "answer, case-insensitively. strict: the answer resolves to exactly one of the four (cleaned) choices, "
            "the dataset's answer.",
            "frq": "upstream-gpt4: the GPT-4 grader labels recorded upstream (evaluation_*_frq: 1 correct, 0 wrong, "
            "-1 no diagnosis), with its extracted diagnosis as resolved.",
            "models": "patient-AI and grader-AI as described in the paper (GPT-4-1106-preview).",
        }
        if self.spec.with_image:
            notes["mcq"] = (
                "The NEJM Image Challenge cases carry no answer choices in the source, so the MCQ "
                "answers are kept but cannot be graded by rule; only FRQ is graded."
            )
            notes["coverage"] = "Only 33 of the 76 GPT-4V result files are in the pinned source."
            notes["images"] = f"{self.images_dropped} image parts dropped from the messages (base64 bytes); text kept."
            if recorded_correct == 0:
                notes["frq_labels"] = "Every recorded upstream-gpt4 label in these files is 0."
        return RunRecord(
            release=self.spec.release,
            kind="upstream",
            model=self.spec.model,
            task=task.name,
            display_name=self.spec.display,
            protocol=upstream_protocol(self.spec.with_image),
            dataset={"name": task.dataset, "config": "all", "sha256": dataset_sha},
            source=source.describe(),
            models={"doctor": self.spec.model, "patient": PATIENT_AND_GRADER, "grader": PATIENT_AND_GRADER},
            roles={
                r: {"model": m, "base_url": None}
                for r, m in (("doctor", self.spec.model), ("patient", PATIENT_AND_GRADER), ("grader", PATIENT_AND_GRADER))
            },
            producer={"name": "ingest", "ingest_version": INGEST_VERSION, "mcq_rules_version": RULES_VERSION},
            counts={
                "cases": self.n_files,
                "conversations": len(self.conv["case_id"]),
                "answers": len(self.ans["case_id"]),
                "answers_by_status": dict(sorted(status.items())),
                "answers_not_ok": not_ok,
            },
            notes=notes,
        )


def _valid_existing(path: Path, source: Source, dataset_sha: str | None) -> bool:
    """An already-ingested release of this source, ingest version and dataset, ingested on this machine: its recorded
    GPT-4 labels noted as made here (:func:`craftmd.release.made_here`); one that came from elsewhere (a copied
    releases folder) is ingested again from the pinned source, never taken at its word."""
    from craftmd.release import made_here

    try:
        rel = read_release(path)
    except CraftMDError:
        return False
    if RECORDED not in made_here(rel):
        return False
    m = rel.manifest
    return (
        m.kind == "upstream"
        and m.source.get("content_sha256") == source.content_sha256
        and m.producer.get("ingest_version") == INGEST_VERSION
        and m.producer.get("mcq_rules_version") == RULES_VERSION
        and m.dataset.get("sha256") == dataset_sha
        and m.protocol == upstream_protocol(m.release in UPSTREAM_MODELS and UPSTREAM_MODELS[m.release].with_image)
        and RECORDED in rel.scorer_records()
    )


def ingest(
    source: Source,
    dataset_dir: Path | str,
    out_dir: Path | str,
    models: list[str] | None = None,
    progress: bool = True,
    *,
    overwrite: bool = False,
    skip_existing: bool = False,
) -> list[Path]:
    """Ingest upstream ``results/<model>/`` folders into releases ``out_dir/<model>/``.

    ``models`` defaults to every upstream model. An existing release is an error unless
    ``overwrite`` (replace it) or ``skip_existing`` (keep it when it is a valid ingest of
    the same source and dataset; re-ingest it otherwise). Returns the release paths.
    """
    out_dir = Path(out_dir)
    models = list(UPSTREAM_MODELS) if models is None else list(models)
    unknown = [m for m in models if m not in UPSTREAM_MODELS]
    if unknown:
        raise CraftMDError(f"unknown upstream model(s) {unknown}; known: {', '.join(UPSTREAM_MODELS)}")
    all_file = config_file(dataset_dir, "all")
    dataset_sha = sha256_file(all_file) if all_file.exists() else None
    cases = {cid: value for (cid, image), value in load_cases(dataset_dir)[0].items() if not image}

    todo, paths = [], {}
    for m in models:
        dest = out_dir / m
        paths[m] = dest
        if dest.exists():
            if skip_existing and _valid_existing(dest, source, dataset_sha):
                continue
            if not (overwrite or skip_existing):
                raise CraftMDError(f"{dest} exists (pass --overwrite to replace it)")
        todo.append(m)
    if not todo:
        return [paths[m] for m in models]

    expected = {m: len(source.pinned([f"results/{m}/*.json"])) for m in todo}
    builders = {m: _Release(UPSTREAM_MODELS[m], cases) for m in todo}
    bar = tqdm(total=sum(expected.values()), desc="ingest", unit="file", disable=not progress, file=None)
    try:
        for f in source.iter_files([f"results/{m}/*.json" for m in todo]):
            match = _FILE.match(f.path)
            if not match:
                continue
            m, case_id = match.groups()
            b = builders[m]
            b.add(f.path, case_id, f.data)
            bar.update(1)
            if b.n_files == expected[m]:
                bar.set_postfix_str(f"writing {m}")
                manifest = b.manifest(source, dataset_sha)
                tables = b.tables()
                inputs = dataset_inputs(dataset_dir)  # write_release adds the answers' hash
                write_release(paths[m], manifest, tables, overwrite=True, scores=(b.scores.table(), b.scorer_records(inputs)))
                del builders[m]
    finally:
        bar.close()
    if builders:  # iter_files raises on a missing pinned file; this guards a pin/source mismatch
        raise CraftMDError(f"incomplete upstream results for {sorted(builders)}")
    return [paths[m] for m in models]


__all__ = ["ingest", "upstream_protocol", "UPSTREAM_MODELS", "INGEST_VERSION"]
