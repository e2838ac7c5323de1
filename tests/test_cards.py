"""The cards and the leaderboard page are filled by one Jinja environment (``craftmd.cards.render.environment``)."""

from __future__ import annotations

import pytest

from craftmd import CraftMDError


def test_one_environment_for_the_cards_and_the_page():
    from craftmd.analysis import page
    from craftmd.cards import render

    assert page.environment is render.environment
    env = render.environment(False)
    # a card template has the page's filters, names are required, block tags are trimmed
    assert (
        env.from_string("{% if x %}\n{{ x | pct }} of {{ n | thousands }}\n{% endif %}\n").render(x=0.25, n=1234)
        == "25.0% of 1,234\n"
    )
    with pytest.raises(CraftMDError, match="card template 'packets_card': 'seed' is undefined"):
        render.render_body("packets_card", {})
    with pytest.raises(CraftMDError, match=r"no card template 'nope' \(cards/nope.md.j2\)"):
        render.render_body("nope", {})
