"""Reading the JSON a model was asked to reply with: one reader for every role (judge, patient, extractor).

A model asked for JSON may send it bare, inside a fenced block, or after a sentence; the reader
tries the whole text, then the first ```json fenced block, then the outermost braces, and returns
the first that decodes. What the value must hold is the caller's to check (a pydantic model, a
JSON schema).
"""

from __future__ import annotations

import json
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def reply_json(text: str | None) -> object:
    """The JSON value of a model's reply: the whole text, a fenced block, or the outermost braces.

    ValueError says why there is none (empty output, no JSON object, not valid JSON).
    """
    if not text or not text.strip():
        raise ValueError("empty output")
    t = text.strip()
    candidates = [t]
    fenced = _FENCED.search(t)
    if fenced:
        candidates.append(fenced.group(1))
    braces = "{" in t and "}" in t and t.index("{") < t.rindex("}")
    if braces:
        candidates.append(t[t.index("{") : t.rindex("}") + 1])
    error = None
    for c in candidates:
        try:
            # strict=False: control characters inside strings (a raw newline or tab) are kept, as llama.cpp's JSON grammar
            # lets a model write them (its string character is anything but a quote or a backslash)
            return json.loads(c, strict=False)
        except json.JSONDecodeError as exc:
            error = exc
    if not braces:
        raise ValueError("no JSON object in the output")
    raise ValueError(f"not valid JSON ({error.msg})")


class Reply(BaseModel):
    """A JSON reply read as a typed record (:func:`validated_reply`): no field but those declared, text stripped."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


#: A text field of a :class:`Reply` that may not be empty.
Text = Annotated[str, Field(min_length=1)]


def validated_reply(text: str | None, model, json_where: str = "") -> tuple[object | None, str | None]:
    """A reply as the pydantic ``model`` -> (its value, None), or (None, why it does not validate: ``invalid reply: ...``,
    at most 300 characters; ``json_where`` comes before the reason a reply holds no JSON)."""
    from pydantic import ValidationError

    if not text or not text.strip():
        return None, "invalid reply: empty"
    try:
        raw = reply_json(text)
    except ValueError as exc:
        return None, f"invalid reply: {json_where}{exc}"[:300]
    try:
        return model.model_validate(raw), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "reply"
        return None, f"invalid reply: {where}: {first['msg']}"[:300]


__all__ = ["reply_json", "Reply", "Text", "validated_reply"]
