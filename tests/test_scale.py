"""Runs that outgrow one server (issue #22): a service's servers as a pool (``<SERVICE>_BASE_URL`` lists several),
shards (``--shard k/K``) merged into one release (``craftmd merge``), and a real router (vllm-router) in front of
OpenAI-compatible servers."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from craftmd.commands.cli import main
from craftmd.generation.runner import GenerateSpec, generate, runner
from craftmd.generation.shards import SHARD_RULE, shard_of
from craftmd.release import read_release

sys.path.insert(0, str(Path(__file__).parent))
from helpers import generate_argv  # noqa: E402
from loopback import LoopbackServer, Replay  # noqa: E402
from realmodel import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA_FILES = ("conversations.parquet", "answers.parquet")
EXPERIMENTS = ["vignette", "multiturn", "summarized", "frq"]


#: The recorded upstream cases of the conftest fixtures upstream and tiny_dataset.
REPLAY = {"n": 5, "seed": 11, "max_messages": 12}


def spec(dataset, out, cache, service: str = "pool", **kw) -> GenerateSpec:
    kw = {"task": "craftmd", "trials": 2, "experiments": EXPERIMENTS, "progress": False, "timeout": 5.0, "backoff": 0.01, **kw}
    return GenerateSpec(
        dataset=dataset, out=out, doctor=f"openai-api/{service}/doc", patient=f"openai-api/{service}/pat", cache=cache, **kw
    )


def data_bytes(release: Path) -> dict[str, bytes]:
    return {f: (release / f).read_bytes() for f in DATA_FILES}


@contextlib.contextmanager
def one_server(upstream):
    """One loopback server replaying the upstream cases, as the service ``one`` (``ONE_BASE_URL``) for the block."""
    with LoopbackServer(Replay(upstream["text"]), models=("doc", "pat")) as s:
        os.environ["ONE_BASE_URL"] = s.base_url
        try:
            yield s
        finally:
            del os.environ["ONE_BASE_URL"]


@pytest.fixture(scope="module")
def reference(tiny_dataset, upstream, tmp_path_factory):
    """The run on one server (a fresh cache): the bytes every pooled, killed, routed and merged run must give."""
    tmp = tmp_path_factory.mktemp("reference")
    with one_server(upstream):
        report = generate(spec(tiny_dataset, tmp / "rel", tmp / "cache.sqlite", service="one"))
    assert report.failures == 0 and report.calls > 50
    return tmp / "rel"


def jobs_of(upstream: dict, replay: Replay, requests: list[dict]) -> list[tuple[str, int]]:
    """(case, trial) of each request: the case whose vignette, first recorded patient turn or summary it carries, and its seed."""

    def cases_in(text: str, marks: dict) -> list[str]:
        return [cid for cid, ms in marks.items() if any(json.dumps(m)[1:-1] in text for m in ms)]

    marks = {
        cid: [rec["case_vignette"].strip(), rec["trial_0"]["multiturn_conversation"][2]["content"]]
        for cid, rec in upstream["text"].items()
    }
    summaries: dict[str, list[str]] = {}
    for r in requests:  # a summary's question carries only the summary: know each case's summaries first
        if Replay.is_summary(r["messages"]):
            [cid] = cases_in(json.dumps(r["messages"]), marks)
            summaries.setdefault(cid, []).append(replay(r))
    out = []
    for r in requests:
        text = json.dumps(r["messages"])
        cases = cases_in(text, marks) or cases_in(text, summaries)
        assert len(cases) == 1, (cases, text[:300])
        out.append((cases[0], r["seed"]))
    return out


# --- pools ---------------------------------------------------------------------------------
def test_a_conversation_stays_on_one_server_and_a_pool_writes_the_one_server_bytes(
    tiny_dataset, upstream, reference, tmp_path, monkeypatch
):
    replay = Replay(upstream["text"])
    servers = [LoopbackServer(replay, models=("doc", "pat"), latency=0.005) for _ in range(3)]
    with servers[0], servers[1], servers[2]:
        monkeypatch.setenv("POOL_BASE_URL", ",".join(s.base_url for s in servers))
        cache = tmp_path / "cache.sqlite"
        report = generate(spec(tiny_dataset, tmp_path / "rel", cache, server_concurrency={"pool": 2}))
        logs = [list(s.log) for s in servers]
        # the same cache over a pool of another shape (one server gone, the order changed): nothing is sent again
        monkeypatch.setenv("POOL_BASE_URL", f"{servers[2].base_url},{servers[0].base_url}")
        again = generate(spec(tiny_dataset, tmp_path / "again", cache))
    assert not replay.mismatches and report.failures == 0
    where: dict[tuple, set] = {}
    jobs = jobs_of(upstream, replay, [r for log in logs for r in log])
    servers_of = [i for i, log in enumerate(logs) for _ in log]
    for job, i in zip(jobs, servers_of):
        where.setdefault(job, set()).add(i)
    assert len(where) == 10  # 5 cases x 2 trials
    assert all(len(s) == 1 for s in where.values()), where  # every turn, summary and question of a job on one server
    assert sum(bool(log) for log in logs) == 3  # and the jobs spread over all three
    assert data_bytes(tmp_path / "rel") == data_bytes(reference)
    assert again.calls == 0 and again.cache_hits == report.requests
    assert data_bytes(tmp_path / "again") == data_bytes(reference)
    roles = read_release(tmp_path / "rel").manifest.roles
    assert roles["doctor"]["base_url"] == ",".join(s.base_url for s in servers) and roles["doctor"]["service"] == "pool"


def test_servers_of_different_speeds_get_work_in_proportion(tiny_dataset, upstream, tmp_path, monkeypatch):
    replay = Replay(upstream["text"])
    # two servers that each answer one request at a time, one four times as fast as the other
    fast = LoopbackServer(replay, models=("doc", "pat"), latency=0.01, max_concurrent=1)
    slow = LoopbackServer(replay, models=("doc", "pat"), latency=0.04, max_concurrent=1)
    with fast, slow:
        monkeypatch.setenv("POOL_BASE_URL", f"{slow.base_url},{fast.base_url}")
        report = generate(
            spec(
                tiny_dataset,
                tmp_path / "rel",
                tmp_path / "cache.sqlite",
                trials=8,
                experiments=["multiturn", "frq"],
                server_concurrency={"pool": 1},
            )
        )
    assert report.failures == 0
    share = fast.served / (fast.served + slow.served)
    print(f"fast server's share {share:.3f} ({fast.served} of {fast.served + slow.served})")
    assert 0.65 <= share <= 0.92, (fast.served, slow.served)  # 0.8 for speeds 4:1
    assert fast.max_in_flight == slow.max_in_flight == 1  # each server's own limit


def test_a_server_killed_mid_run_loses_nothing(tiny_dataset, upstream, reference, tmp_path, monkeypatch):
    replay = Replay(upstream["text"])
    killed = threading.Event()

    def dying(request):  # the second server is killed after its 12th request, with requests in flight
        if victim.calls >= 12 and not killed.is_set():
            killed.set()
            threading.Thread(target=victim.kill, daemon=True).start()
        return replay(request)

    survivor = LoopbackServer(replay, models=("doc", "pat"), latency=0.02)
    victim = LoopbackServer(dying, models=("doc", "pat"), latency=0.02)
    with survivor, victim:
        monkeypatch.setenv("POOL_BASE_URL", f"{victim.base_url},{survivor.base_url}")
        engine = runner(spec(tiny_dataset, tmp_path / "rel", tmp_path / "cache.sqlite", server_concurrency={"pool": 4}))
        report = engine.run()
        time.sleep(0.1)
        assert killed.is_set() and victim._loop is None  # it was stopped mid-run
    assert not replay.mismatches
    assert report.failures == 0, report.summary()
    assert 12 <= victim.served < report.calls / 2 and survivor.served > report.calls / 2
    gone, alive = engine.callers["openai-api/pool/doc"].model.pool.members
    assert gone.dead and gone.dead.startswith("connection refused") and alive.dead is None, (
        gone,
        alive,
    )  # taken out, not retried forever
    assert data_bytes(tmp_path / "rel") == data_bytes(reference)


def test_a_server_that_answers_5xx_is_taken_out_after_the_retries_and_the_last_one_never(monkeypatch):
    import asyncio

    from craftmd.models import Sampling
    from craftmd.models.connect import CallSettings, Connections
    from craftmd.models.pool import in_conversation

    async def ask(conn, n):
        caller = conn.caller("openai-api/pool/m")
        return await asyncio.gather(
            *(in_conversation(caller([{"role": "user", "content": f"q{i}"}], Sampling())) for i in range(n))
        )

    def run(urls, n):
        monkeypatch.setenv("POOL_BASE_URL", ",".join(urls))

        async def go():
            async with Connections(CallSettings(max_retries=2, backoff=0.001, concurrency=2), ["openai-api/pool/m"]) as conn:
                return await ask(conn, n), conn.pools["pool"].members

        return asyncio.run(go())

    bad = LoopbackServer(lambda r: "ok", models=("m",), error_rate=1.0, error_kinds=("500",))
    good = LoopbackServer(lambda r: "ok", models=("m",))
    with bad, good:
        results, (b, g) = run([bad.base_url, good.base_url], 12)
        assert all(r.status == "ok" for r in results) and good.served == 12
        assert b.dead.startswith("HTTP 500") and g.dead is None
        assert 3 <= bad.calls < 6 * 3  # taken out when one request used its three attempts: the others moved before theirs
        bad2 = LoopbackServer(lambda r: "ok", models=("m",), error_rate=1.0, error_kinds=("500",))
        with bad2:  # every server fails: the last is kept, and a request fails as it would on one server (transient)
            results, members = run([bad.base_url, bad2.base_url], 2)
        assert all(r.status == "error" and r.transient and r.reason.startswith("HTTP 500") for r in results), results
        assert sum(m.dead is None for m in members) == 1


def test_a_conversation_known_by_name_alone_stays_on_one_server(monkeypatch):
    """A runner that only names its jobs in CONVERSATION (a string, no end) gets them pinned as well."""
    import asyncio

    from craftmd.models import Sampling
    from craftmd.models.calls import CONVERSATION
    from craftmd.models.connect import CallSettings, Connections

    servers = [LoopbackServer(lambda r: "ok", models=("m",), latency=0.01) for _ in range(3)]
    with servers[0], servers[1], servers[2]:
        monkeypatch.setenv("POOL_BASE_URL", ",".join(s.base_url for s in servers))

        async def go():
            async with Connections(CallSettings(concurrency=2), ["openai-api/pool/m"]) as conn:
                caller = conn.caller("openai-api/pool/m")

                async def job(name):
                    CONVERSATION.set(name)
                    for turn in range(4):
                        await caller([{"role": "user", "content": f"{name} turn {turn}"}], Sampling())

                await asyncio.gather(*(job(f"job{i}") for i in range(9)))

        asyncio.run(go())
        where = {}
        for i, s in enumerate(servers):
            for r in s.log:
                where.setdefault(r["messages"][0]["content"].split()[0], set()).add(i)
    assert len(where) == 9 and all(len(v) == 1 for v in where.values()) and len(set().union(*where.values())) == 3


def test_a_pool_lists_each_server_once(monkeypatch):
    from craftmd import CraftMDError
    from craftmd.models import PoolModel, get_model

    monkeypatch.setenv("TWO_BASE_URL", "http://127.0.0.1:9/v1, http://127.0.0.1:10/v1")
    m = get_model("openai-api/two/m")
    assert isinstance(m, PoolModel) and m.server == "http://127.0.0.1:9/v1,http://127.0.0.1:10/v1"
    assert m.cache_server == get_model("openai-api/two/m").cache_server == "service:two"
    monkeypatch.setenv("TWO_BASE_URL", "http://127.0.0.1:9/v1,http://127.0.0.1:9/v1")  # one server listed twice is one server
    assert not isinstance(get_model("openai-api/two/m"), PoolModel)
    monkeypatch.setenv("TWO_BASE_URL", "http://127.0.0.1:9/v1,ftp://x")
    with pytest.raises(CraftMDError, match="TWO_BASE_URL 'ftp://x' is not an http"):
        get_model("openai-api/two/m")


# --- shards --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tiny_dataset, upstream, tmp_path_factory):
    """The reference run as three shards (a fresh cache): releases s1, s2, s3, and s2 of another seed."""
    tmp = tmp_path_factory.mktemp("shards")
    with one_server(upstream):
        for k in (1, 2, 3):
            generate(spec(tiny_dataset, tmp / f"s{k}", tmp / "cache.sqlite", service="one", shard=(k, 3)))
        generate(spec(tiny_dataset, tmp / "other2", tmp / "cache.sqlite", service="one", shard=(2, 3), seed=7))
        generate(spec(tiny_dataset, tmp / "half1", tmp / "cache.sqlite", service="one", shard=(1, 2)))
    return tmp


def test_shards_merged_give_the_unsharded_release_byte_for_byte(shards, upstream, reference, tmp_path, capsys):
    cases = {cid: shard_of(cid, 3) for cid in upstream["text"]}
    for k in (1, 2, 3):  # each shard holds its samples only (every trial of them), and says which shard it is
        rel = read_release(shards / f"s{k}")
        assert {r["case_id"] for r in rel.table("conversations").to_pylist()} == {c for c, s in cases.items() if s == k}
        assert rel.manifest.producer["shard"] == {"k": k, "of": 3, "rule": SHARD_RULE}
    assert main(["merge", str(shards / "s3"), str(shards / "s1"), str(shards / "s2"), "--out", str(tmp_path / "merged")]) == 0
    assert "merged       3 shards" in capsys.readouterr().err
    assert data_bytes(tmp_path / "merged") == data_bytes(reference)
    merged, whole = read_release(tmp_path / "merged").manifest, read_release(reference).manifest
    assert merged.producer == {"merged": {"shards": 3, "rule": SHARD_RULE}} and merged.notes["shards"] == "merged from 3 shards"
    assert merged.files == whole.files and merged.source == whole.source
    assert merged.counts == whole.counts  # jobs, requests and tokens summed; cases and trials the whole run's
    # the rule is the documented one: sha256 of the id, first 8 bytes big-endian, mod K, plus 1
    assert all(s == int(hashlib.sha256(c.encode()).hexdigest()[:16], 16) % 3 + 1 for c, s in cases.items())


@pytest.mark.parametrize(
    "given, message",
    [
        (["s1", "s2"], "shard 3/3 missing (given 2 of 3)"),
        (["s1", "s2", "s2", "s3"], "shard 2/3 given twice"),
        (["s1", "other2", "s3"], "is not a shard of the same run as"),
        (["s1", "s2", "half1"], "is shard 1/2"),
        (["s1", "s2", "REF"], "is not a shard release"),
    ],
)
def test_a_missing_repeated_or_foreign_shard_is_refused_and_nothing_written(shards, reference, tmp_path, capsys, given, message):
    paths = [str(reference) if g == "REF" else str(shards / g) for g in given]
    assert main(["merge", *paths, "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert not (tmp_path / "merged").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["0/3", "4/3", "1/0", "x", "2"])
def test_a_bad_shard_is_refused(tiny_dataset, tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        main(generate_argv(tiny_dataset, "--shard", bad, doctor="openai/m", out=tmp_path / "r", quiet=False))
    assert exc.value.code == 2 and "--shard" in capsys.readouterr().err and not (tmp_path / "r").exists()


# --- a real router ---------------------------------------------------------------------------
def router_binary() -> Path | None:
    named = os.environ.get("CRAFTMD_ROUTER")
    path = Path(named) if named else ROOT / ".venv-router" / "bin" / "vllm-router"
    return path if path.exists() else None


@pytest.mark.skipif(router_binary() is None, reason="vllm-router is not installed: `make router` puts it in .venv-router")
def test_a_generation_through_vllm_router_in_front_of_two_servers(tiny_dataset, upstream, reference, tmp_path, monkeypatch):
    replay = Replay(upstream["text"])
    a, b = LoopbackServer(replay, models=("doc", "pat")), LoopbackServer(replay, models=("doc", "pat"))
    with a, b:
        port = free_port()
        log = open(tmp_path / "router.log", "wb")
        proc = subprocess.Popen(
            [
                str(router_binary()),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                "round_robin",
                "--worker-urls",
                f"http://127.0.0.1:{a.port}",
                f"http://127.0.0.1:{b.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                        break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "router.log").read_text()[-2000:]
                    time.sleep(0.2)
            monkeypatch.setenv("ROUTED_BASE_URL", f"http://127.0.0.1:{port}/v1")
            report = generate(spec(tiny_dataset, tmp_path / "rel", tmp_path / "cache.sqlite", service="routed"))
        finally:
            proc.terminate()
            proc.wait(10)
            log.close()
    assert report.failures == 0 and not replay.mismatches
    assert a.served and b.served and a.served + b.served == report.calls  # the router spread the requests over both
    assert data_bytes(tmp_path / "rel") == data_bytes(reference)


# --- encounters ---------------------------------------------------------------------------------
from encounter_script import Script, medpi  # noqa: E402,F401  (medpi: the fixture)


def test_encounters_over_a_pool_and_in_shards_merge_to_the_one_server_release(medpi, tmp_path, monkeypatch, capsys):
    def run(service: str, out: str, shard=None):
        return generate(
            GenerateSpec(
                task="encounters",
                dataset=medpi,
                out=tmp_path / out,
                doctor=f"openai-api/{service}/loopback",
                patient=f"openai-api/{service}/loopback",
                trials=2,
                cache=tmp_path / f"{out}.sqlite",
                progress=False,
                max_retries=1,
                backoff=0.01,
                shard=shard,
            )
        )

    one, a, b = (LoopbackServer(Script(doctor_turns=3)) for _ in range(3))
    with one, a, b:
        monkeypatch.setenv("ONE_BASE_URL", one.base_url)
        monkeypatch.setenv("POOL_BASE_URL", f"{a.base_url},{b.base_url}")
        whole = run("one", "whole")
        for k in (1, 2):
            run("pool", f"s{k}", (k, 2))
    assert whole.conversations == 4 and a.served and b.served
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "merged")]) == 0
    files = sorted(read_release(tmp_path / "whole").manifest.files)
    assert files == ["closures.parquet", "conversations.parquet", "memory_tags.parquet", "patient_states.parquet"]
    for f in files:
        assert (tmp_path / "merged" / f).read_bytes() == (tmp_path / "whole" / f).read_bytes(), f
