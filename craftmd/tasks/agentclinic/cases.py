"""AgentClinic's cases, read in place from the pinned source (or from a case file of one's own in their shape).

The pinned archive ``agentclinic-<COMMIT>.tar.gz`` (``../shared/sources``; github.com/SamuelSchmidgall/AgentClinic,
MIT) is read with :class:`craftmd.source.Source`, each file checked against this folder's pin
(``pin/<COMMIT>.sha256``), never unpacked or copied into the package. Its four case sets:

* ``medqa`` (107 cases) and ``medqa_extended`` (214): OSCE-style cases built from MedQA-USMLE items, each line
  ``{"OSCE_Examination": {"Objective_for_Doctor", "Patient_Actor", "Physical_Examination_Findings", "Test_Results",
  "Correct_Diagnosis"}}``;
* ``nejm`` (15 lines) and ``nejm_extended`` (120): NEJM Image Challenge cases, each ``image_url`` (NEJM's server; the
  image is not in the archive), ``question``, ``patient_info``, ``physical_exams`` and ``answers`` (one marked correct).

A case is :class:`Case`: what the doctor is told (its objective), what the patient holds, what the measurement agent
holds (the examination findings and test results), the diagnosis the moderator compares with, and, for an NEJM case,
its image's URL. Its id is the set's prefix and its line in the file (``medqa_12``: line 12 of the MedQA file). A line
that is not a case of its set's shape is one line naming the file, the line and the field.
"""

from __future__ import annotations

import hashlib
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from craftmd import CraftMDError

#: The pinned commit of AgentClinic's repository, and the archive of it in ``../shared/sources``.
COMMIT = "b6570edefb940857a7c334350656b29f9d984f24"
ARCHIVE = f"agentclinic-{COMMIT}.tar.gz"
PIN = Path(__file__).parent / "pin" / f"{COMMIT}.sha256"
#: case set -> (its file in the archive, the prefix of its case ids, its shape).
CASE_SETS = {
    "medqa": ("agentclinic_medqa.jsonl", "medqa", "osce"),
    "medqa_extended": ("agentclinic_medqa_extended.jsonl", "medqa_ext", "osce"),
    "nejm": ("agentclinic_nejm.jsonl", "nejm", "nejm"),
    "nejm_extended": ("agentclinic_nejm_extended.jsonl", "nejm_ext", "nejm"),
}
ATTRIBUTION = (
    'Schmidgall, S., Ziaei, R., Harris, C., Reis, E., Jopling, J., Moor, M. "AgentClinic: a multimodal agent benchmark '
    'to evaluate AI in simulated clinical environments." arXiv 2405.07960 (2024), github.com/SamuelSchmidgall/AgentClinic '
    f"(commit {COMMIT}), MIT licence"
)
OSCE_FIELDS = ("Objective_for_Doctor", "Patient_Actor", "Physical_Examination_Findings", "Test_Results", "Correct_Diagnosis")
NEJM_FIELDS = ("image_url", "question", "patient_info", "physical_exams", "answers")


@dataclass(frozen=True)
class Case:
    """One AgentClinic case, as the protocol's roles see it."""

    case_id: str
    case_set: str  # medqa, medqa_extended, nejm, nejm_extended, or the stem of a case file of one's own
    objective: str  # what the doctor is told at the start ("" for an NEJM case: the prompt set's nejm_objective.txt)
    patient: str  # what the patient holds (rendered from the case's fields)
    exam: str  # what the measurement agent holds: examination findings and test results
    answer: str  # the correct diagnosis, what the moderator compares with
    image_url: str | None = None  # an NEJM case's image (NEJM's server)
    image: bytes | None = None  # its bytes, once fetched (an NEJM case is never posed without them)

    @property
    def vignette(self) -> str:
        """What the case is about (an inspect sample's input): the doctor's objective, else the patient's facts."""
        return self.objective or self.patient

    @property
    def with_image(self) -> bool:
        return self.image_url is not None


def _label(key: str) -> str:
    return key.replace("_", " ").strip()


def render(value, indent: int = 0) -> str:
    """A case field as plain text, one item a line (nested fields indented under their names), in the file's order:
    deterministic, the same bytes for the same field."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            if isinstance(v, (dict, list)):
                lines += [f"{pad}{_label(k)}:", render(v, indent + 1)]
            else:
                lines.append(f"{pad}{_label(k)}: {str(v).strip()}")
        return "\n".join(x for x in lines if x)
    if isinstance(value, list):
        return "\n".join(render(v, indent) if isinstance(v, (dict, list)) else f"{pad}- {str(v).strip()}" for v in value)
    return f"{pad}{str(value).strip()}"


def _need(obj, field: str, where: str, kinds=(str, dict, list)):
    value = obj.get(field) if isinstance(obj, dict) else None
    if value is None or (isinstance(value, str) and not value.strip()):
        raise CraftMDError(f"{where}: no {field}")
    if not isinstance(value, kinds):
        raise CraftMDError(f"{where}: {field} is a {type(value).__name__}, not {' or '.join(k.__name__ for k in kinds)}")
    return value


def osce_case(obj, case_id: str, case_set: str, where: str) -> Case:
    """A case of AgentClinic's MedQA shape (``OSCE_Examination``); one line naming the field it lacks."""
    osce = obj.get("OSCE_Examination") if isinstance(obj, dict) else None
    if not isinstance(osce, dict):
        raise CraftMDError(f"{where}: no OSCE_Examination object")
    for field in OSCE_FIELDS:
        _need(
            osce,
            field,
            f"{where}: OSCE_Examination",
            (str,) if field in ("Objective_for_Doctor", "Correct_Diagnosis") else (str, dict, list),
        )
    exam = {"Physical examination": osce["Physical_Examination_Findings"], "Test results": osce["Test_Results"]}
    return Case(case_id, case_set, osce["Objective_for_Doctor"].strip(), render(osce["Patient_Actor"]), render(exam),
                osce["Correct_Diagnosis"].strip())  # fmt: skip


def nejm_case(obj, case_id: str, case_set: str, where: str) -> Case:
    """A case of AgentClinic's NEJM shape; one line naming the field it lacks, or when not exactly one answer is correct."""
    if not isinstance(obj, dict):
        raise CraftMDError(f"{where}: not a JSON object")
    for field in NEJM_FIELDS:
        _need(obj, field, where, (list,) if field == "answers" else (str,))
    right = [a.get("text") for a in obj["answers"] if isinstance(a, dict) and a.get("correct") is True]
    if len(right) != 1 or not isinstance(right[0], str) or not right[0].strip():
        raise CraftMDError(f"{where}: answers mark {len(right)} correct choices with a text, not one")
    url = obj["image_url"].strip()
    if urllib.parse.urlsplit(url).scheme != "https":
        raise CraftMDError(f"{where}: image_url {url[:80]!r} is not an https URL")
    # no objective of its own: the doctor is given the prompt set's (nejm_objective.txt)
    return Case(case_id, case_set, "", obj["patient_info"].strip(), obj["physical_exams"].strip(), right[0].strip(), url)


def parse_cases(data: bytes, name: str, case_set: str, prefix: str, shape: str) -> list[Case]:
    """The cases of one JSON-lines file (``name``: what its errors call it), one per non-empty line, id ``<prefix>_<line>``."""
    from craftmd.jsonl import json_lines

    make = osce_case if shape == "osce" else nejm_case
    out = [make(obj, f"{prefix}_{n}", case_set, f"{name}:{n}") for n, obj in json_lines(data, name)]
    if not out:
        raise CraftMDError(f"{name}: no case in it")
    return out


def shared_sources() -> tuple[Path, ...]:
    """The folders the pinned sources are kept in: ``../shared/sources`` beside the checkout, and beside the working folder."""
    repo = Path(__file__).resolve().parents[3]
    return (repo.parent / "shared" / "sources", Path.cwd().parent / "shared" / "sources")


def locate(dataset: Path | str) -> Path:
    """Where the pinned source is, given the folder a run is pointed at (``--dataset``): that folder's ``ARCHIVE``, the
    archive itself, or a folder where it was unpacked; else (a folder of another task's dataset, as a leaderboard of
    several tasks gives every scorer) the archive in ``../shared/sources`` beside the checkout or the working folder.
    One line when it is none of these."""
    path = Path(dataset).expanduser()
    if path.is_file():
        return path
    if (path / f"AgentClinic-{COMMIT}").is_dir():
        return path
    for folder in (path, *shared_sources()):
        if (folder / ARCHIVE).is_file():
            return folder / ARCHIVE
    raise CraftMDError(
        f"no pinned AgentClinic source in {path}: give --dataset the folder that holds {ARCHIVE} "
        "(../shared/sources), the archive, or the folder it was unpacked in"
    )


def open_source(dataset: Path | str):
    """The pinned source as a verified :class:`craftmd.source.Source` (each file checked against this folder's pin)."""
    from craftmd.source import Source

    return Source(locate(dataset), commit=COMMIT, pin=PIN)


def own_file(value: str) -> bool:
    """Whether a ``case_set`` names a case file of one's own (a ``.jsonl`` path), not one of :data:`CASE_SETS`."""
    return value.endswith(".jsonl")


def load_cases(dataset: Path | str, case_set: str, ids: list[str] | None = None) -> tuple[list[Case], dict]:
    """The cases of ``case_set`` (a name of :data:`CASE_SETS`, read from the pinned source found at ``dataset``; or a
    ``.jsonl`` file of one's own in the MedQA shape), those of ``ids`` when given (an unknown id is one line), and what
    the run record says of where they came from (the source's content hash, or the file's sha256)."""
    if own_file(case_set):
        path = Path(case_set).expanduser()
        if not path.is_file():
            raise CraftMDError(f"case file {path} does not exist")
        data = path.read_bytes()
        cases = parse_cases(data, path.name, path.stem, path.stem, "osce")
        origin = {"case_file": path.name, "sha256": hashlib.sha256(data).hexdigest()}
    else:
        if case_set not in CASE_SETS:
            raise CraftMDError(f"unknown case set {case_set!r}; known: {', '.join(CASE_SETS)} (or a .jsonl file of cases)")
        file, prefix, shape = CASE_SETS[case_set]
        src = open_source(dataset)
        cases = parse_cases(src.read(file), file, case_set, prefix, shape)
        origin = {**src.describe(), "file": file, "sha256": src.pin[file]}
    if ids:
        known = {c.case_id: c for c in cases}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise CraftMDError(f"unknown case id(s) in case set {case_set!r}: {', '.join(unknown[:5])}")
        wanted = set(ids)
        cases = [c for c in cases if c.case_id in wanted]
    return cases, origin


#: What an image's bytes must start with to be one (JPEG, PNG, GIF, WebP).
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF8", b"RIFF")


def image_key(url: str) -> str:
    """The name an NEJM image is kept under in an images folder: its ``id`` query value (``IC20240111``), else the URL's
    sha256."""
    ids = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("id")
    return ids[0] if ids and ids[0].replace("-", "").replace("_", "").isalnum() else hashlib.sha256(url.encode()).hexdigest()


def fetch_image(case: Case, folder: Path | None, timeout: float = 30.0) -> bytes:
    """The image of an NEJM case: from ``folder`` (``<id>.jpg``/``.png``/... by :func:`image_key`) when given, else from
    NEJM's server. One line when it cannot be had: the case is never posed without it."""
    key = image_key(case.image_url)
    if folder is not None:
        found = sorted(Path(folder).glob(f"{key}.*"))
        if not found:
            raise CraftMDError(
                f"case {case.case_id}: no image {key}.* in {folder}; an NEJM case is never posed without its image"
            )
        data = found[0].read_bytes()
    else:
        try:
            with urllib.request.urlopen(case.image_url, timeout=timeout) as resp:  # noqa: S310 - https checked by nejm_case
                data = resp.read(32 * 1024 * 1024)
        except (OSError, ValueError) as exc:  # offline, refused, timed out (URLError is an OSError)
            host = urllib.parse.urlsplit(case.image_url).netloc
            why = " ".join(str(getattr(exc, "reason", exc)).split())[:120]
            raise CraftMDError(
                f"case {case.case_id}: its image cannot be had from {host} ({why}); an NEJM case is never posed without its "
                "image (run where NEJM's server is reachable, or give -T image_dir=DIR)"
            ) from None
    if not data.startswith(_MAGIC):
        raise CraftMDError(f"case {case.case_id}: the image {key} is not a JPEG, PNG, GIF or WebP file")
    return data


__all__ = ["Case", "CASE_SETS", "COMMIT", "ARCHIVE", "PIN", "ATTRIBUTION", "load_cases", "parse_cases", "locate",
           "open_source", "fetch_image", "image_key", "render", "own_file"]  # fmt: skip
