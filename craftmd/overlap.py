"""Which cases are the same case in two benchmarks, and the benchmark every training split is kept apart from.

Each registered task gives the texts of its test cases (:attr:`craftmd.tasks.Task.cases`), read from the dataset folders
given (or from its own pinned source): :func:`task_cases`. Two cases of two tasks are **the same case** by the rule the
training sets are decontaminated by (:mod:`craftmd.text`: a shared word 8-gram found through an index, then MELD's
similarity or the share of 8-grams), applied both ways, since neither side is the candidate: :func:`same_cases` lists
every such pair, :func:`pair_counts` counts them per pair of tasks. :func:`benchmark` merges every task's cases into
the one benchmark a training split is decontaminated against. Nothing here names a task: a task registered from a task
file, with its own cases, takes part as the built-in ones do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from craftmd import CraftMDError
from craftmd.text import LEVENSHTEIN_THRESHOLD, NGRAM, NGRAM_THRESHOLD, NgramIndex, same_case, similar, similarity

SAME_CASE_DOC = (
    f"two cases of two tasks are the same case when their texts (each lower-cased, punctuation dropped, whitespace "
    f"made one space) share a word {NGRAM}-gram and either, taken as a training candidate against the other, would be "
    f"dropped by the training sets' decontamination: MELD's normalised Levenshtein similarity (1 - distance / longer "
    f"length) reaches {LEVENSHTEIN_THRESHOLD}, or the share of that case's distinct {NGRAM}-grams the other has reaches "
    f"{NGRAM_THRESHOLD}"
)


@dataclass
class TaskCases:
    """The registered tasks' test cases found: texts by task (the registry's order), and the tasks not found, with why."""

    texts: dict[str, dict[str, str]] = field(default_factory=dict)  # task -> {case id: text}
    datasets: dict[str, str] = field(default_factory=dict)  # task -> the dataset it poses
    missing: dict[str, str] = field(default_factory=dict)  # task -> why its cases are not compared


def task_cases(folders) -> TaskCases:
    """Every registered task's (:func:`craftmd.tasks.builtin_tasks`) test cases, each from the first of ``folders`` that
    holds them. A task that declares none, or whose cases none of the folders holds, is in ``missing`` with why; a hook
    that gives something else than texts by id is one line."""
    from craftmd.tasks import builtin_tasks, in_order

    folders = [Path(f) for f in folders]
    out = TaskCases()
    for task in in_order(builtin_tasks()):
        if task.cases is None:
            out.missing[task.name] = "it declares no cases"
            continue
        for folder in folders:
            got = task.cases(folder)
            if got is not None:
                if not isinstance(got, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in got.items()):
                    raise CraftMDError(f"task {task.name!r}: its cases({folder}) gave {type(got).__name__}, not texts by case id")
                out.texts[task.name], out.datasets[task.name] = got, task.dataset
                break
        else:
            out.missing[task.name] = "its cases are not in the dataset folders read"
    return out


def same_cases(cases: TaskCases) -> list[dict]:
    """Every pair of cases of two tasks that are the same case (:data:`SAME_CASE_DOC`), one dict each: ``task_a``,
    ``case_a``, ``task_b``, ``case_b`` (``task_a`` before ``task_b`` in the registry's order; cases in natural id order),
    ``similarity`` (MELD's, exact), ``share_a`` and ``share_b`` (the share of each case's distinct 8-grams the other
    has). Each task's cases are indexed once; only the cases sharing an 8-gram are ever compared."""
    indexes = {t: NgramIndex(texts) for t, texts in cases.texts.items()}
    names = list(indexes)
    rows = []
    for i, a in enumerate(names):
        A = indexes[a]
        for b in names[i + 1 :]:
            B = indexes[b]
            for ca in sorted(A.rank, key=A.rank.__getitem__):
                ga = A.grams[ca]
                for cb, k in sorted(B.counts(ga).items(), key=lambda kv: B.rank[kv[0]]):
                    na, nb = A.norm[ca], B.norm[cb]
                    share_a, share_b = k / len(ga), k / len(B.grams[cb])
                    share = max(share_a, share_b)
                    if same_case(0.0, share) or same_case(similar(na, nb), share):
                        sim = 1.0 if na == nb else similarity(na, nb)  # one dataset posed by two tasks: mostly equal
                        rows.append({"task_a": a, "case_a": ca, "task_b": b, "case_b": cb, "similarity": round(sim, 4),
                                     "share_a": round(share_a, 4), "share_b": round(share_b, 4)})  # fmt: skip
    return rows


def pair_counts(cases: TaskCases, rows: list[dict]) -> list[dict]:
    """Per pair of tasks compared (the registry's order): their cases, whether they pose the same dataset, the pairs of
    same cases (:func:`same_cases`' ``rows``) and how many cases of each side are in one."""
    names = list(cases.texts)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            mine = [r for r in rows if r["task_a"] == a and r["task_b"] == b]
            out.append({"task_a": a, "task_b": b, "cases_a": len(cases.texts[a]), "cases_b": len(cases.texts[b]),
                        "same_dataset": cases.datasets[a] == cases.datasets[b], "pairs": len(mine),
                        "cases_a_shared": len({r["case_a"] for r in mine}),
                        "cases_b_shared": len({r["case_b"] for r in mine})})  # fmt: skip
    return out


@dataclass
class Benchmark:
    """Every task's test cases as one benchmark: texts by key, and the tasks each key's case belongs to."""

    texts: dict[str, str]
    tasks: dict[str, list[str]]
    missing: dict[str, str]  # the tasks not in it, with why (TaskCases.missing)

    def counts(self) -> dict[str, int]:
        """Cases per task."""
        out: dict[str, int] = {}
        for names in self.tasks.values():
            for t in names:
                out[t] = out.get(t, 0) + 1
        return out


def benchmark(cases: TaskCases, exclude: tuple[str, ...] = ()) -> Benchmark:
    """The tasks' cases (but those of ``exclude``) as one benchmark, in the registry's order: a case's key is its id,
    shared by the tasks that give the same text under it (two tasks posing one dataset), ``task/id`` when an earlier
    task already gives another text under the id."""
    texts: dict[str, str] = {}
    tasks: dict[str, list[str]] = {}
    for task, given in cases.texts.items():
        if task in exclude:
            continue
        for cid, text in given.items():
            key = cid if texts.get(cid, text) == text else f"{task}/{cid}"
            texts.setdefault(key, text)
            tasks.setdefault(key, []).append(task)
    return Benchmark(texts, tasks, dict(cases.missing))


__all__ = ["TaskCases", "task_cases", "same_cases", "pair_counts", "Benchmark", "benchmark", "SAME_CASE_DOC"]
