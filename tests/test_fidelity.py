"""What makes a number or a figure differ from the paper's for reasons a reader cannot see (issue 42).

The papers' numbering, written here apart from the package's captions so that this test checks them: *Nature Medicine*
2025 (Johri et al.) Fig. 2 is the four settings, Fig. 4 the image cases, Extended Data Fig. 5 the single-diagnosis
subset (its Extended Data Fig. 1 is the specialties and MELD, not the exam); the exam comparisons are the preprint's
(medRxiv 2024), whose p-value tables upstream released as ``results/statistics/fig2c``, ``fig3d`` and ``fig4c``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from craftmd.analysis import page, paper_figures

PAPER_NUMBERING = {
    "settings_tests.png": "Nature Medicine 2025, Fig. 2",
    "single_dx.png": "Nature Medicine 2025, Extended Data Fig. 5",
    "mcq_vs_frq.png": "Nature Medicine 2025, Supplementary Table 3",
    "vision.png": "Nature Medicine 2025, Fig. 4",
    "exam.png": "preprint (medRxiv 2024)",
}
CARDS = Path(page.__file__).resolve().parents[1] / "cards"


def test_every_paper_figure_has_a_caption():
    assert [f for f, _, _ in page.PAPER_FIGURES] == list(paper_figures.PAPER_FIGURES) == list(PAPER_NUMBERING)


@pytest.mark.parametrize(("name", "alt", "caption"), page.PAPER_FIGURES)
def test_captions_name_the_paper_and_figure_they_reproduce(name, alt, caption):
    assert PAPER_NUMBERING[name] in caption
    # Nature Medicine's Extended Data Fig. 1 is the specialties and MELD; its Extended Data Fig. 4 is not the subset
    assert "Extended Data Fig. 1" not in caption and "Extended Data Fig. 4" not in caption
    # a bare "Fig. N" always says whose: every figure number follows the paper's name in the same caption
    assert "the paper's Fig" not in caption


def test_single_dx_caption_says_what_the_subset_holds():
    caption = dict((f, c) for f, _, c in page.PAPER_FIGURES)["single_dx.png"]
    assert "Derm-Public and Derm-Private" in caption and "no MedQA case" in caption


def test_exam_caption_and_note_cite_the_preprints_tables():
    caption = dict((f, c) for f, _, c in page.PAPER_FIGURES)["exam.png"]
    for table in ("fig2c_stats.tsv", "fig3d_stats.tsv", "fig4c_stats.tsv"):
        assert table in caption
    note = re.search(r'<p class="note" id="exam-none">(.*?)</p>', (CARDS / "leaderboard_paper.html.j2").read_text()).group(1)
    assert "medRxiv 2024" in note and "Extended Data Fig. 1" not in note


def test_figure_module_docstrings_cite_no_wrong_figure():
    for module in (paper_figures,):
        text = Path(module.__file__).read_text()
        assert "Extended Data Fig. 4" not in text
        # Extended Data Fig. 1 may only be named as what it is (the specialties and MELD), never as the exam figure
        for m in re.finditer(r"Extended Data Fig\. 1", text):
            assert "specialties and MELD" in text[m.start() : m.start() + 60]


def _published_paragraph() -> str:
    from craftmd.cards.render import environment

    row = {
        "table": "figs3b_stats.tsv",
        "preprint_model": "GPT-3.5",
        "group": "derm_private",
        "published_p": 0.149,
        "p_value": 1e-4,
    }
    t = {
        "published": [row, row],
        "published_same": [row],
        "published_differ": [row],
        "format": [],
        "image": [],
        "image_models": [],
        "experts": [],
    }
    html = (
        environment(True)
        .get_template("leaderboard_paper.html.j2")
        .render(board=False, paper_tests=t, paper_figures=[], exam_data=True)
    )
    return re.search(r'<p id="published-tests">(.*?)</p>', html, re.S).group(1)


def test_the_preprint_comparison_is_described_as_another_experiment():
    text = _published_paragraph()
    assert "not a replication" in text
    for difference in ("140 dermatology cases", "earlier versions", "10 trials"):
        assert difference in text
    assert "equal in 1 of 2 cells" in text and "not that they measured the same thing" in text


def test_the_page_says_which_cases_the_skin_panels_hold():
    from craftmd.cards.render import environment

    html = (
        environment(True)
        .get_template("leaderboard_paper.html.j2")
        .render(
            board=False,
            paper_tests=None,
            paper_figures=[{"src": "figures/single_dx.png", "alt": "a", "caption": "c"}],
            exam_data=True,
        )
    )
    note = re.search(r'<p class="note" id="skin-panels">(.*?)</p>', html, re.S).group(1)
    assert "Nature Medicine 2025, Fig. 3" in note and "MedQA's dermatology cases only" in note
    assert "Derm-Public and Derm-Private cases only" in note and "Extended Data Fig. 5" in note
