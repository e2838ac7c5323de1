"""Names someone chose (a release folder, ``--model``, a display name) made safe for the medium they are shown in."""

from __future__ import annotations

import polars as pl

#: Columns whose text is a name someone chose (a release folder, ``--model``, a display name): in a CSV such a cell
#: that a spreadsheet would read as a formula is neutralised (:func:`csv_safe`).
NAME_COLUMNS = ("release", "model", "display", "model_a", "model_b", "a", "b")
#: What a spreadsheet takes for the start of a formula (OWASP, CSV injection): = + - @ tab, carriage return.
FORMULA_START = r"^[=+\-@\t\r]"


def csv_safe(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with every name cell (:data:`NAME_COLUMNS`) that starts like a formula prefixed with ``'`` (OWASP's advice),
    so a spreadsheet shows it as text; other cells, and names that start otherwise, as they are."""
    cols = [c for c in NAME_COLUMNS if c in df.columns and df.schema[c] == pl.String]
    return (
        df.with_columns(
            pl.when(pl.col(c).str.contains(FORMULA_START)).then(pl.lit("'") + pl.col(c)).otherwise(pl.col(c)).alias(c)
            for c in cols
        )
        if cols
        else df
    )


__all__ = ["csv_safe", "NAME_COLUMNS", "FORMULA_START"]
