"""Time the analysis of every table with one release of each other task beside CRAFT-MD's upstream releases.

    python bench/bench_tasks_analysis.py [--packets DIR] [--cases 100] [--trials 2]

Not timed, made first in a temporary folder: a consultation release over the first ``--cases`` text cases of
``out/data`` (its key-value items extracted, the protocol played and graded against the loopback server, as
tests/test_consultation.py does), and an encounters release over the packets of ``--packets`` (a built medpi folder,
``craftmd encounters build``; default ``out/medpi``, where `make packets` writes them), ``--trials`` encounters per packet,
judged in category mode (as tests/test_judge_encounters.py does); without packets the encounters release is left out,
with a note, and the rest is timed. Timed: ``analyse`` of the six upstream releases (``out/releases``, as
`make leaderboard` leaves them) plus those two, every table and figure at 10,000 resamples, and the page.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _consultation(data: Path, releases: Path, tmp: Path, n: int) -> None:
    from loopback import LoopbackServer
    from test_consultation import Models

    from craftmd.commands.cli import main as cli

    sub = tmp / "consult-data"
    (sub / "all").mkdir(parents=True)
    from craftmd.release import natural_key

    df = pl.read_parquet(data / "all" / "test-00000-of-00001.parquet")
    keep = sorted(df["case_id"].to_list(), key=natural_key)[:n]
    df.filter(pl.col("case_id").is_in(keep)).write_parquet(sub / "all" / "test-00000-of-00001.parquet")
    with LoopbackServer(Models()) as server:
        common = ["--base-url", server.base_url, "--cache", str(tmp / "consult.sqlite")]
        assert cli(["keyinfo", "extract", "--dataset", str(sub), "--model", "openai/loopback", *common, "--quiet"]) == 0
        assert cli(["generate", "--task", "consultation", "--dataset", str(sub), "--doctor", "openai/loopback", "--patient", "openai/loopback",
                    "--solver", "openai/loopback", *common, "--seed", "3", "--temperature", "0", "--out", str(releases / "consult-bench"),
                    "--quiet"]) == 0  # fmt: skip
    assert (
        cli(
            [
                "score",
                str(releases / "consult-bench"),
                "--dataset",
                str(sub),
                "--scorer",
                "paper",
                "--scorer",
                "offline",
                "--quiet",
            ]
        )
        == 0
    )
    shutil.copytree(sub / "keyinfo", data / "keyinfo")  # the analysis' dataset: out/data with these items


def _encounters(packets: Path, releases: Path, tmp: Path, trials: int) -> None:
    from encounter_script import Script, run
    from loopback import LoopbackServer
    from test_judge_encounters import judge_reply

    from craftmd.commands.cli import main as cli

    out = releases / "encounters-bench"
    with LoopbackServer(Script(doctor_turns=3)) as server:
        # few encounters at a time: each instantiates its patient's memory store (embeddings on the CPU) in the event loop
        run(server, packets, out, tmp / "enc.sqlite", trials=trials, concurrency=4, timeout=900.0)
    with LoopbackServer(judge_reply, models=("judge-a",)) as server:
        assert cli(["score", str(out), "--scorer", "judge:openai/judge-a", "--base-url", server.base_url, "--dataset", str(packets), "--mode",
                    "category", "--max-invalid", "1", "--quiet"]) == 0  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--packets",
        type=Path,
        default=None,
        help="a built medpi folder (craftmd encounters build; default out/medpi when it is there, else no encounters release)",
    )
    p.add_argument("--cases", type=int, default=100, help="consultation cases (default 100)")
    p.add_argument("--trials", type=int, default=1, help="encounters per packet (default 1)")
    p.add_argument("--keep", type=Path, help="copy the analysis' output here")
    p.add_argument("--repeat", type=int, default=2, help="time the analysis this many times (default 2)")
    p.add_argument(
        "--work", type=Path, help="prepare the two releases here and keep them; a folder prepared before is used as it is"
    )
    args = p.parse_args(argv)
    from craftmd.analysis.bootstrap import DEFAULT_B
    from craftmd.analysis.page import write_page
    from craftmd.analysis.tables import analyse

    here = ROOT / "out"
    if args.packets is None and (here / "medpi").is_dir():
        args.packets = here / "medpi"
    if args.packets is None:
        print(
            "note: no packets (make packets builds them into out/medpi, or pass --packets DIR): the encounters release is left "
            "out of the timing",
            file=sys.stderr,
        )
    if not (here / "releases").is_dir() or not (here / "data" / "all").is_dir():
        print("run `make leaderboard` first (it leaves out/releases and out/data)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.work or Path(scratch)
        releases, data = tmp / "releases", tmp / "data"
        if (tmp / "prepared").exists():
            print(f"using the releases prepared in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(releases, ignore_errors=True)
            shutil.rmtree(data, ignore_errors=True)
            releases.mkdir(parents=True)
            for r in sorted((here / "releases").iterdir()):
                (releases / r.name).symlink_to(r.resolve())
            shutil.copytree(here / "data", data)
            print("preparing (not timed): a consultation release and a judged encounters release ...", file=sys.stderr)
            _consultation(data, releases, tmp, args.cases)
            if args.packets is not None:
                _encounters(args.packets, releases, tmp, args.trials)
            (tmp / "prepared").write_text(f"--cases {args.cases} --trials {args.trials} --packets {args.packets}\n")

        upstream = tmp / "upstream"
        shutil.rmtree(upstream, ignore_errors=True)
        upstream.mkdir()
        for r in sorted((here / "releases").iterdir()):
            (upstream / r.name).symlink_to(r.resolve())
        t = time.perf_counter()
        write_page(analyse(upstream, here / "data", tmp / "base", B=DEFAULT_B), tmp / "base")
        print(f"baseline: the upstream releases alone in {time.perf_counter() - t:.2f} s")
        for _ in range(args.repeat):
            t = time.perf_counter()
            a = analyse(releases, data, tmp / "out", B=DEFAULT_B, packets=args.packets)
            write_page(a, tmp / "out")
            total = time.perf_counter() - t
            n_consult = a.tasks["consultation"]["consult_accuracy"].filter(pl.col("setting") == "upper")["n_cases"].max()
            encounters = "no encounters release (no packets)"
            if args.packets is not None:
                n_enc = a.tasks["encounters"]["encounter_endings"]["n"].sum()
                encounters = (
                    f"{n_enc} encounters of {a.tasks['encounters']['rubric_by_encounter']['n_cases'].max()} judged packets"
                )
            print(f"every table, figure and the page in {total:.2f} s (B={DEFAULT_B}; sql {a.timings['sql_s']:.2f} s, "
                  f"bootstrap+tests {a.timings['bootstrap_s']:.2f} s, rubric {a.timings['rubric_s']:.2f} s, other tasks {a.timings['tasks_s']:.2f} s, figures {a.timings['figures_s']:.2f} s): 6 upstream releases, "
                  f"a consultation release of {n_consult} cases, {encounters}")  # fmt: skip
        if args.keep:
            shutil.copytree(tmp / "out", args.keep, dirs_exist_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
