"""The leaderboard page at a board of 1,000 releases: its size and the time it takes to open in headless Chromium.

    .venv/bin/python bench/bench_page.py [--releases DIR --dataset DIR] [--sizes 6,100,1000] [--audits DIR] [--keep DIR]

The whole analysis of 1,000 releases is another benchmark's (bench/bench_board.py); this one measures the page alone.
The given releases (default: out/releases and out/data, as `make leaderboard` leaves them) are analysed once (tables
only); for each size, :func:`replicate` then makes the analysis of a board of that many copies of them, cycling
through them as ``bench_board.make_board`` names its copies (``<release>-<i>``, displayed ``<display> #<i>``): every
per-release row of every table copied under the copy's id, each copy's accuracies shifted by a small amount of its own
so that the copies do not tie, and each pair tested within one round of copies (as many pairs as the analysis' tests
of neighbours and the leader, linear in the board). A size equal to the number of releases is the analysis itself.

Printed per size: the releases, the page's bytes (``index.html``; figures are not drawn here, so none are counted),
the seconds :func:`craftmd.analysis.page.render` takes, the board's rows in the HTML and those shown before a reader
asks, and the median over three opens of the time headless Chromium (``make browser``) takes to load the page
(``loadEventEnd`` of the navigation, each in a fresh tab of one browser).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

#: the columns of the analysis' frames that hold a release id, per frame
RELEASE_COLUMNS = {
    "accuracy": ("model",),
    "pvalues": ("model", "a", "b"),  # a and b are releases in the "model" family (between models), settings else
    "answer_status": ("model",),
    "mcq_rule_gap": ("model",),
    "metrics": ("model",),
    "releases": ("release",),
    "history_tests": ("model_a", "model_b"),
    "history_by_coverage": ("model",),
    "history_by_complexity": ("model",),
    "format_tests": ("model",),
    "image_tests": ("model",),
    "order_tests": ("upstream_release", "other_release"),
    "claims": ("release",),
}


def replicate(a, n: int, *, step: float = 0.0004):
    """The analysis ``a`` as if its board held ``n`` copies of its releases: copy ``i`` of release ``r`` (cycling
    through them in order) is ``f"{r}-{i:03d}"``, displayed ``f"{display} #{i:03d}"``; its accuracies (point and CI)
    are ``a``'s minus ``step`` times ``i // len(releases)`` (clipped to [0, 1]), so that later rounds of copies rank
    lower; a row naming two releases (a test between models) is copied when both are of the same round."""
    ids = a.releases["release"].to_list()
    k = len(ids)
    copy = pl.DataFrame(
        {
            "_src": [ids[i % k] for i in range(n)],
            "_round": [i // k for i in range(n)],
            "_new": [f"{ids[i % k]}-{i:03d}" for i in range(n)],
        },
        schema={"_src": pl.String, "_round": pl.Int64, "_new": pl.String},
    )
    rounds = pl.DataFrame({"_round": list(range(-(-n // k)))}, schema={"_round": pl.Int64})
    frames = {}
    for name, cols in RELEASE_COLUMNS.items():
        df = getattr(a, name, None)
        if df is None:
            continue
        id_cols = [c for c in cols if c in df.columns]
        out = df.with_row_index("_row").join(rounds, how="cross")
        for c in id_cols:
            out = out.join(copy.rename({"_src": c, "_new": f"_new_{c}"}), on=[c, "_round"], how="left")
        # a row is copied into each round where each release it names has a copy (a column that holds no release id
        # here, such as a setting in a test between settings, stays as it is)
        named = [pl.col(c).is_in(ids) for c in id_cols]
        keep = pl.any_horizontal(named)
        for c, is_id in zip(id_cols, named):
            keep = keep & (~is_id | pl.col(f"_new_{c}").is_not_null())
        out = out.filter(keep).with_columns([pl.coalesce(pl.col(f"_new_{c}"), pl.col(c)).alias(c) for c in id_cols])
        if name == "releases":
            out = out.with_columns((pl.col("display") + " #" + pl.col("release").str.extract(r"-(\d+)$")).alias("display"))
        if name == "accuracy":
            shift = pl.col("_round").cast(pl.Float64) * step
            out = out.with_columns([(pl.col(c) - shift).clip(0.0, 1.0).alias(c) for c in ("accuracy", "ci_low", "ci_high")])
        frames[name] = out.sort("_round", "_row").drop(["_row", "_round", *[f"_new_{c}" for c in id_cols]])
    big = dataclasses.replace(a, **frames, board=None)
    big.__dict__.pop("_view", None)
    return big


def render(a, out: Path, audits: list[dict] | None = None) -> tuple[Path, float]:
    """The page of ``a`` written into ``out`` (as `craftmd analyse --page` writes it) and the seconds it took."""
    from craftmd.analysis.page import write_page

    t = time.perf_counter()
    page = write_page(a, out, audits)
    return page, time.perf_counter() - t


def load_seconds(page: Path, opens: int = 3) -> list[float]:
    """Seconds headless Chromium takes to load ``page`` (the navigation's ``loadEventEnd``), each in a fresh tab."""
    from test_leaderboard import DevTools

    with tempfile.TemporaryDirectory(prefix="bench-page-chromium-") as prof:
        b = DevTools(Path(prof))
        try:
            b.open("about:blank")
            times = []
            for _ in range(opens):
                b.open(page.resolve().as_uri())
                for _ in range(100):
                    ms = b.js("performance.getEntriesByType('navigation')[0].loadEventEnd")
                    if ms:
                        break
                    time.sleep(0.05)
                times.append(ms / 1000)
            return times
        finally:
            b.close()


def board_rows(html: str) -> tuple[int, int]:
    """The main board's rows in the HTML and those shown before a reader asks (not ``hidden``)."""
    body = html[html.index('id="leaderboard"') :]
    body = body[: body.index("</tbody>")]
    rows = re.findall(r"<tr(?: [^>]*)?>", body)[1:]  # the header row first
    return len(rows), sum("hidden" not in r for r in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=Path, default=ROOT / "out" / "releases")
    p.add_argument("--dataset", type=Path, default=ROOT / "out" / "data")
    p.add_argument("--sizes", default="6,100,1000", help="board sizes (comma-separated; default 6,100,1000)")
    p.add_argument("--audits", type=Path, help="a folder of audit JSON files to render, as `craftmd leaderboard` does")
    p.add_argument("--keep", type=Path, help="write each page under KEEP/<size>/ (default: a temporary folder)")
    p.add_argument("--no-browser", action="store_true", help="do not open the pages in Chromium")
    args = p.parse_args(argv)
    if not args.releases.is_dir():
        print(f"no releases under {args.releases} (run `make leaderboard`, or give --releases and --dataset)", file=sys.stderr)
        return 2
    from craftmd.analysis.tables import analyse, read_audits

    audits = read_audits(args.audits)
    with tempfile.TemporaryDirectory(prefix="bench-page-") as tmp:
        t = time.perf_counter()
        a = analyse(args.releases, args.dataset, Path(tmp) / "analysis", figures=False)
        print(f"analysed {a.releases.height} releases in {time.perf_counter() - t:.1f} s (tables only; not part of the page)")
        print(f"{'releases':>8} {'page MB':>8} {'render s':>9} {'board rows':>10} {'shown':>6} {'load s (median of 3)':>21}")
        for n in (int(s) for s in args.sizes.split(",")):
            big = a if n == a.releases.height else replicate(a, n)
            out = (args.keep or Path(tmp)) / str(n)
            page, secs = render(big, out, audits)
            html = page.read_text()
            rows, shown = board_rows(html)
            load = "" if args.no_browser else f"{statistics.median(load_seconds(page)):.2f}"
            print(f"{n:>8} {page.stat().st_size / 1e6:>8.2f} {secs:>9.2f} {rows:>10} {shown:>6} {load:>21}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
