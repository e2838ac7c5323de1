"""Hostile submissions: whatever a file holds, validation lists its problems with file, line and reason,
never crashes, and reads the file a line (or a parquet batch) at a time.

A small dataset folder (ten cases) stands in for the built dataset, so these run in seconds."""

from __future__ import annotations

import json
import string

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from craftmd import CraftMDError
from craftmd.commands.cli import main
from craftmd.scoring.submission import MAX_MESSAGE_CHARS, SubmissionError, check_model_name, validate_submission

ROW = {"case_id": "case_1", "trial": 0, "setting": "vignette", "format": "frq", "response": "Psoriasis"}
CASES = [f"case_{i}" for i in range(1, 11)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "all").mkdir()
    pl.DataFrame({"case_id": CASES, "source": ["medqa_usmle"] * 10, "specialty": ["Dermatology"] * 10}).write_parquet(
        d / "all" / "test-00000-of-00001.parquet"
    )
    return d


def problems(path, dataset) -> list[tuple[int | None, str]]:
    with pytest.raises(SubmissionError) as e:
        validate_submission(path, dataset)
    return e.value.problems


def test_hostile_lines_are_listed_with_their_line(tmp_path, tiny, capsys):
    lines = [
        json.dumps(ROW),
        "[" * 100_000,  # deeper than Python's JSON parser goes
        '{"case_id": "case_2", "trial": ' + "9" * 5000 + ', "setting": "vignette", "format": "frq", "response": "x"}',
        '{"case_id": "case_3", "trial": 0, "setting": "vignette", "format": "frq", "response": "\\ud800"}',
        '{"case_id": "case_4", "trial": 0, "trial": 1, "setting": "vignette", "format": "frq", "response": "x"}',
        json.dumps(dict(ROW, setting="x" * 100_000)),
    ]
    p = tmp_path / "sub.jsonl"
    p.write_text("\n".join(lines) + "\n")
    got = dict(problems(p, tiny))
    assert got[2].startswith("not a row: nested too deeply")
    assert got[3].startswith("not a row: a number too long to read")
    assert got[4].startswith("not a row: a lone surrogate")
    assert got[5] == "not a row: the key 'trial' is given twice in one object"
    assert got[6].startswith("unknown setting 'xxx") and len(got[6]) <= MAX_MESSAGE_CHARS
    assert main(["validate", str(p), "--dataset", str(tiny)]) == 2
    err = capsys.readouterr().err
    assert "sub.jsonl:5: not a row: the key 'trial' is given twice" in err and "Traceback" not in err


def test_parquet_text_that_is_not_utf8(tmp_path, tiny):
    good = pa.array([b"Psoriasis", b"Ps\xf6riasis", b"Eczema"], pa.binary())
    bad = pa.Array.from_buffers(pa.string(), 3, good.buffers())  # string column holding invalid UTF-8
    t = pa.table(
        {
            "case_id": ["case_1", "case_2", "case_3"],
            "trial": pa.array([0, 0, 0], pa.int64()),
            "setting": ["vignette"] * 3,
            "format": ["frq"] * 3,
            "response": bad,
        }
    )
    p = tmp_path / "sub.parquet"
    pq.write_table(t, p)
    assert problems(p, tiny) == [(2, "response is not UTF-8 (byte 0xf6 at character 3)")]


def test_parquet_with_a_column_twice(tmp_path, tiny):
    t = pa.Table.from_arrays(
        [pa.array(["case_1"]), pa.array([0]), pa.array(["vignette"]), pa.array(["frq"]), pa.array(["a"]), pa.array(["b"])],
        names=["case_id", "trial", "setting", "format", "response", "response"],
    )
    p = tmp_path / "sub.parquet"
    pq.write_table(t, p)
    assert problems(p, tiny) == [(None, "column(s) 'response' appear more than once")]


def test_a_line_too_long_is_skipped_without_holding_it(tmp_path, tiny):
    p = tmp_path / "sub.jsonl"
    p.write_text(
        json.dumps(ROW) + "\n" + '{"response": "' + "x" * 3_000_000 + '"}\n' + json.dumps(dict(ROW, case_id="case_2")) + "\n"
    )
    assert problems(p, tiny) == [(2, "line too long (3,000,016 bytes; at most 1,000,000)")]


def test_a_valid_file_read_in_batches_keeps_every_row(tmp_path, tiny, monkeypatch):
    import craftmd.scoring.submission as sub

    monkeypatch.setattr(sub, "BATCH_ROWS", 7)  # many batches, for both formats
    rows = [
        dict(ROW, case_id=c, trial=t, format=f, response=f"{c} {t} {f}")
        for c in CASES[:8]
        for t in range(3)
        for f in ("frq", "mcq4")
    ]
    p = tmp_path / "sub.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    q = tmp_path / "sub.parquet"
    pl.DataFrame(rows).write_parquet(q)
    for path in (p, q):
        v = validate_submission(path, tiny)
        got = v.rows.with_columns(pl.col(pl.Categorical).cast(pl.Utf8)).to_dicts()
        assert sorted(got, key=str) == sorted([dict(r, with_image=False) for r in rows], key=str)
        assert v.missing.height == 2 * 3 * 2  # cases 9 and 10, in each of the 6 cells
        assert set(v.missing["case_id"]) == {"case_9", "case_10"}
    dup = tmp_path / "dup.jsonl"
    dup.write_text("".join(json.dumps(r) + "\n" for r in rows + rows[3:4]))
    assert problems(dup, tiny) == [(len(rows) + 1, "duplicate row: case_1 trial 1 vignette/mcq4 already on line 4")]


@pytest.mark.parametrize(
    "name, why",
    [
        ("acme\x1b[31m", "control character '\\x1b'"),
        ("acme\nmodel", "control character '\\n'"),
        ("a" * 500, "500 characters long"),
        ("  ", "empty"),
    ],
)
def test_model_names_refused_at_submission(name, why):
    with pytest.raises(CraftMDError, match="--model: .*" + why.replace("\\", "\\\\").replace("[", "\\[")):
        check_model_name(name)


def test_model_names_that_are_shown_escaped_pass():
    for name in ("evil$\\frac{$x", '=HYPERLINK("http://x")', "a|b", "<script>alert(1)</script>", "acme/med-7b"):
        assert check_model_name(name) == name


# -- a minute of random malformed lines: no crash, every problem one of the listed kinds ------------------------------

KINDS = ("not JSON", "truncated line", "not UTF-8", "empty line", "empty file", "line too long", "not a row:", "expected a JSON object",
         "unexpected field(s)", "is missing (required field)", "has the wrong type", "unknown ", "is too long", "is not a case id",
         "duplicate row", "trial: ")  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
fields = st.sampled_from([*ROW, "with_image", "extra"])
mutated_rows = st.builds(
    lambda k, v, drop: {**{x: y for x, y in ROW.items() if x != drop}, k: v}, fields, json_values, st.sampled_from([None, *ROW])
)
good_rows = st.builds(
    lambda c, t, s, f: dict(ROW, case_id=c, trial=t, setting=s, format=f),
    st.sampled_from(CASES + ["case_99"]),
    st.integers(0, 3),
    st.sampled_from(["vignette", "multiturn"]),
    st.sampled_from(["frq", "mcq4"]),
)
specials = st.sampled_from(
    [
        "[" * 5000,
        "{" * 5000,
        '{"a":' * 900 + "1" + "}" * 900,
        "9" * 5000,
        '{"trial": ' + "1" * 4400 + "}",
        '"\\ud800"',
        '{"case_id": "\\udfff", "trial": 0}',
        '{"a": 1, "a": 2}',
        "",
        "   ",
        "\t",
        "null",
        "NaN",
        '{"response": "' + "é" * 30000 + '"}',
        "\ufeff" + json.dumps(ROW),
        json.dumps(ROW)[:-3],
    ]
)
lines = st.one_of(
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ")),
    st.text(alphabet=string.printable, max_size=60).map(lambda t: t.replace("\n", " ").encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    mutated_rows.map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    good_rows.map(lambda r: json.dumps(r).encode()),
    specials.map(lambda s: s.encode("utf-8", "surrogatepass")),
)


@settings(
    max_examples=2000,  # 6,000 took 214 s of CI's two cores, the suite's fourth slowest step; 2,000 take about 30 s
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(st.lists(lines, min_size=0, max_size=12), st.booleans(), st.booleans())
def test_random_malformed_files_never_crash(tmp_path, tiny, body, final_newline, crlf):
    p = tmp_path / "random.jsonl"
    sep = b"\r\n" if crlf else b"\n"
    p.write_bytes(sep.join(body) + (sep if final_newline and body else b""))
    try:
        v = validate_submission(p, tiny)
    except SubmissionError as e:
        assert e.total >= len(e.problems) >= 1
        n_lines = len(body)
        for line, msg in e.problems:
            assert line is None or 1 <= line <= n_lines
            assert msg.isprintable() and len(msg) <= MAX_MESSAGE_CHARS
            assert any(k in msg for k in KINDS), msg
        str(e).encode("utf-8")  # printable as it is
    else:
        assert v.rows.height >= 1
