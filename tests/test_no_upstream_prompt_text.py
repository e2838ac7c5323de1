"""The package's tree holds none of upstream's prompt sentences (issue #42): every prompt upstream's runs used is read
from the pinned code at run time (``craftmd.upstream_prompts``), never pasted into a file of the package.

Every prompt function of the pinned ``src/prompts.py`` is rendered through the same parse the package uses, cut into
sentences, and each sentence of seven words or more is looked for in every tracked file outside ``tests/`` (the
CHANGELOG and the docs included: they describe the prompts, they do not quote them).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_WORDS = 7


def upstream_sentences(source) -> set[str]:
    from craftmd.upstream_prompts import upstream_code

    code = upstream_code(source)
    out = set()
    for name, template in code.templates.items():
        text = template.render(*(["Other"] + ["placeholder"] * 8)[: len(template.params)])
        for sentence in re.split(r"(?<=[.!?])\s+|\n", text):
            sentence = sentence.strip(" '\"*")
            if len(sentence.split()) >= MIN_WORDS and "placeholder" not in sentence:
                out.add(sentence)
    return out


def test_no_tracked_file_outside_the_tests_quotes_upstreams_prompts(source):
    sentences = upstream_sentences(source)
    assert len(sentences) >= 40  # the parse gave upstream's prompts: a broken parse must not pass this test
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    quoted = {}
    for name in files:
        if name.startswith("tests/"):
            continue
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        found = sorted(s for s in sentences if s in text)
        if found:
            quoted[name] = found[:3]
    assert not quoted, f"upstream's prompt sentences pasted into the package: {quoted}"
