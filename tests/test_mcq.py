"""The two MCQ rules on answers of the shapes the upstream models give."""

from __future__ import annotations

import pytest

from craftmd import CraftMDError
from craftmd.scoring.mcq import grade_mcq

CHOICES = ["Hemophilia A", "Von Willebrand disease", "Acute lymphoblastic leukemia", "Immune thrombocytopenic purpura"]
ANSWER = "Von Willebrand disease"


def both(response, choices=CHOICES, answer=ANSWER):
    return grade_mcq(response, choices, answer, "paper"), grade_mcq(response, choices, answer, "strict")


@pytest.mark.parametrize(
    "response",
    [
        "Von Willebrand disease",
        "**Final Diagnosis:** Von Willebrand disease",
        "Final diagnosis: von willebrand disease.",
        "The most likely diagnosis is Von Willebrand Disease",
    ],
)
def test_a_clean_correct_answer_is_correct_under_both_rules(response):
    paper, strict = both(response)
    assert paper == ("Von Willebrand disease", "single", True)
    assert strict == ("Von Willebrand disease", "single", True)


@pytest.mark.parametrize("response", ["B", "B)", "(B)", "b.", "Answer: B"])
def test_strict_reads_a_bare_letter(response):
    assert grade_mcq(response, CHOICES, ANSWER, "strict") == ("Von Willebrand disease", "single", True)
    # the paper rule only looks for the choice's text
    assert grade_mcq(response, CHOICES, ANSWER, "paper")[2] is False


def test_an_answer_listing_several_choices_is_credited_by_paper_only():
    response = "Final Diagnosis: Hemophilia A or Von Willebrand disease. Further tests are needed."
    paper, strict = both(response)
    assert paper == ("Hemophilia A; Von Willebrand disease", "multiple", True)
    assert strict[1] == "multiple" and strict[2] is False


def test_strict_narrows_a_verbose_answer_to_its_final_diagnosis_line():
    response = (
        "Final Diagnosis: Von Willebrand disease.\n\n(Note: other possibilities such as Hemophilia A or "
        "immune thrombocytopenic purpura should be excluded.)"
    )
    assert grade_mcq(response, CHOICES, ANSWER, "strict") == ("Von Willebrand disease", "single", True)


def test_a_longer_choice_hides_the_shorter_one_inside_it():
    choices = ["Neuroleptic malignant syndrome", "Sepsis", "Exertional heat stroke", "Non-exertional heat stroke"]
    r = grade_mcq("The most likely diagnosis is:\n\nNon-exertional heat stroke", choices, "Non-exertional heat stroke", "strict")
    assert r == ("Non-exertional heat stroke", "single", True)
    r = grade_mcq("Exertional heat stroke", choices, "Non-exertional heat stroke", "strict")
    assert r == ("Exertional heat stroke", "single", False)


GLANZMANN = (
    ["Hemophilia A", "Idiopathic thrombocytopenic purpura", "Glanzmann’s thrombasthenia", "Thrombotic thrombocytopenic purpura"],
    "Glanzmann’s thrombasthenia",
)
XANTHELASMA = ["Necrobiotic xanthogranuloma (NXG)", "Xanthelasma", "Granuloma annulare", "Langerhan cell histiocytosis"]


@pytest.mark.parametrize("response, choices, answer, rule, correct", [
    # strict forgives case, punctuation, quotes and a small typo ...
    ("Glanzmann's thrombasthenia", *GLANZMANN, "strict", True),
    ("Glanzman thrombasthenia", *GLANZMANN, "strict", True),
    # ... but the literal paper rule does not
    ("Glanzmann's thrombasthenia", *GLANZMANN, "paper", False),
    # The paper rule matches the recorded answer text literally: upstream's answer key keeps a trailing space on
    # some answers, and the published figures were computed with it.
    ("Xanthelasma.", XANTHELASMA, "xanthelasma ", "paper", False),
    ("Xanthelasma is most likely", XANTHELASMA, "xanthelasma ", "paper", True),
    ("Xanthelasma.", XANTHELASMA, "Xanthelasma ", "strict", True),
])  # fmt: skip
def test_what_each_rule_forgives(response, choices, answer, rule, correct):
    assert grade_mcq(response, choices, answer, rule)[2] is correct


def test_a_wrong_choice_and_an_answer_naming_none():
    paper, strict = both("**Final Diagnosis:** Immune thrombocytopenic purpura")
    assert paper == ("Immune thrombocytopenic purpura", "single", False)
    assert strict == ("Immune thrombocytopenic purpura", "single", False)
    paper, strict = both("Final Diagnosis: Migraine")
    assert paper == (None, "none", False)
    assert strict == (None, "none", False)


@pytest.mark.parametrize("response", [None, "", "   "])
def test_a_missing_answer_is_wrong(response):
    for rule in ("paper", "strict"):
        assert grade_mcq(response, CHOICES, ANSWER, rule) == (None, "none", False)


def test_bad_inputs_are_refused_with_one_line():
    with pytest.raises(CraftMDError, match="unknown MCQ rule"):
        grade_mcq("B", CHOICES, ANSWER, "lenient")
    with pytest.raises(CraftMDError, match="without its choices"):
        grade_mcq("Sarcoidosis", [], "Sarcoidosis", "paper")


def test_strict_does_not_mistake_a_near_spelling_with_another_meaning():
    choices = ["Hyperthyroidism", "Graves disease", "Thyroid storm", "Thyroiditis"]
    assert grade_mcq("Hypothyroidism", choices, "Hyperthyroidism", "strict") == (None, "none", False)
    choices = ["Endometritis", "Adenomyosis", "Leiomyoma", "Cervical cancer"]
    assert grade_mcq("Endometriosis", choices, "Endometritis", "strict") == (None, "none", False)
