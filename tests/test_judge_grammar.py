"""A reply written under llama.cpp's JSON grammar is read as JSON: the grammar llama-cpp-python's server makes from a
schema (``response_format`` ``json_object`` with a ``schema``) lets a string hold any character but a quote or a
backslash, so a small model's rationale may hold a raw newline or tab; that reply is valid by the grammar the server
enforced, and a judge that called it "not JSON" failed every such reply (the local path's judge, SmolLM2-135M)."""

from __future__ import annotations


from craftmd.scoring.judge import validate_reply


def test_a_reply_with_a_raw_newline_in_a_string_is_scored():
    reply = '{"dimension": "communication.empathy", "score": 3, "rationale": "Kind.\n\tClear.", "evidence": ["I see"]}'
    valid, problems = validate_reply(reply, ["communication.empathy"], "dimension")
    assert not problems and valid["communication.empathy"]["score"] == 3
    assert valid["communication.empathy"]["rationale"] == "Kind.\n\tClear."


def test_a_reply_that_is_not_json_is_still_refused():
    valid, problems = validate_reply(
        '{"dimension": "communication.empathy", "score": 3, "rationale": "cut', ["communication.empathy"], "dimension"
    )
    assert not valid and problems == {"communication.empathy": "the reply is not JSON"}
