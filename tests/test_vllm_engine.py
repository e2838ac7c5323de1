"""vLLM's offline engine for the paper's set-up on one GPU, with a stand-in ``vllm`` module (no GPU in the suite):
roles on one model share one engine, distinct engines split the GPU's memory by one rule, and each role's engine
settings reach the engine and the run record."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import types

import pytest

import craftmd.models as models
from craftmd import CraftMDError
from craftmd.commands.cli import main as cli_main
from craftmd.models.connect import CallSettings, Connections

REPLAY = {"n": 1, "seed": 5, "max_messages": 6}


class _Gen:
    def __init__(self, text):
        self.text, self.token_ids, self.finish_reason = text, [1, 2], "stop"


class _Out:
    def __init__(self, text):
        self.prompt_token_ids, self.outputs = [1, 2, 3], [_Gen(text)]


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module whose ``LLM`` records how it was built; every engine in a fresh registry."""
    built: list[dict] = []

    class LLM:
        def __init__(self, **kwargs):
            built.append(kwargs)

        def chat(self, batch, params, use_tqdm=True):
            return [_Out("The most likely diagnosis is psoriasis.") for _ in batch]

    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = LLM, lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(models, "_VLLM_ENGINES", {})
    return built


def _generate(tiny_dataset, tmp_path, *extra: str) -> int:
    return cli_main(
        [
            "generate",
            "--dataset",
            str(tiny_dataset),
            "--out",
            str(tmp_path / "rel"),
            "--cache",
            str(tmp_path / "c.sqlite"),
            "--experiments",
            "vignette,frq",
            "--quiet",
            *extra,
        ]
    )


def test_two_roles_on_one_model_build_one_engine_with_their_settings(fake_vllm, tiny_dataset, tmp_path):
    assert (
        _generate(
            tiny_dataset,
            tmp_path,
            "--doctor",
            "vllm/org/m",
            "--patient",
            "vllm/org/m",
            "--engine-arg",
            "max_model_len=4096",
            "--engine-arg",
            "doctor.dtype=bfloat16",
            "--engine-arg",
            "patient.tensor_parallel_size=1",
        )
        == 0
    )
    want = {"max_model_len": 4096, "dtype": "bfloat16", "tensor_parallel_size": 1, "gpu_memory_utilization": 0.9}
    assert fake_vllm == [{"model": "org/m", **want}]  # one engine, the whole share of the GPU, every setting
    roles = json.loads((tmp_path / "rel" / "manifest.json").read_text())["roles"]
    assert roles["doctor"]["engine"] == roles["patient"]["engine"] == want


def test_engines_of_two_models_split_the_gpu_by_the_rule(fake_vllm):
    async def build(names, engine_args):
        async with Connections(CallSettings(engine_args=engine_args), names) as conn:
            for n in names:
                conn.model(n).llm  # noqa: B018 - load the engine
            return {n: conn.server(n)["engine"] for n in names}

    got = asyncio.run(build(["vllm/doctor-model", "vllm/patient-model"], {}))
    assert [b["gpu_memory_utilization"] for b in fake_vllm] == [0.45, 0.45]  # 0.9 / 2 distinct engines
    assert got == {"vllm/doctor-model": {"gpu_memory_utilization": 0.45}, "vllm/patient-model": {"gpu_memory_utilization": 0.45}}
    fake_vllm.clear()
    models._VLLM_ENGINES.clear()
    asyncio.run(build(["vllm/a", "vllm/b", "vllm/c"], {"vllm/a": {"gpu_memory_utilization": 0.5}}))
    assert [b["gpu_memory_utilization"] for b in fake_vllm] == [0.5, 0.2, 0.2]  # what 0.9 leaves, shared equally


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine-arg", "doctor.dtype=int3"], "expected one of auto"),
        (["--engine-arg", "doctor.max_model_length=10"], "not one of tensor_parallel_size"),
        (["--engine-arg", "gpu_memory_utilization=1.5"], r"fraction in \(0, 1\]"),
    ],
)
def test_a_bad_engine_setting_is_one_line(fake_vllm, tiny_dataset, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        _generate(tiny_dataset, tmp_path, "--doctor", "vllm/m", "--patient", "vllm/m", *args)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--engine-arg" in err and re.search(message, err)
    assert not fake_vllm and not (tmp_path / "rel").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "--doctor",
                "vllm/m",
                "--patient",
                "vllm/m",
                "--engine-arg",
                "doctor.max_model_len=4096",
                "--engine-arg",
                "patient.max_model_len=8192",
            ],
            "share the engine of vllm/m but set max_model_len",
        ),
        (
            [
                "--doctor",
                "vllm/a",
                "--patient",
                "vllm/b",
                "--engine-arg",
                "doctor.gpu_memory_utilization=0.6",
                "--engine-arg",
                "patient.gpu_memory_utilization=0.6",
            ],
            "adds up to 1.2 > 1",
        ),
        (["--doctor", "vllm/a", "--patient", "openai/gpt-4o", "--engine-arg", "patient.dtype=half"], "is not a vllm/ model"),
        (["--doctor", "vllm/a", "--patient", "vllm/a", "--engine-arg", "judge.dtype=half"], "the run's roles are"),
        (["--doctor", "openai/a", "--patient", "openai/b", "--engine-arg", "dtype=half"], "no role of the run is one"),
    ],
)
def test_engine_settings_that_cannot_hold_are_refused_before_loading(
    fake_vllm, tiny_dataset, tmp_path, capsys, monkeypatch, args, message
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert _generate(tiny_dataset, tmp_path, *args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not fake_vllm and not (tmp_path / "rel").exists()


def test_a_loaded_engine_is_not_silently_given_other_settings(fake_vllm):
    m = models.get_model("vllm/m")
    m.configure({"gpu_memory_utilization": 0.9})
    m.llm  # noqa: B018
    m.configure({"gpu_memory_utilization": 0.9})  # the same settings: fine
    with pytest.raises(CraftMDError, match="already loaded"):
        m.configure({"gpu_memory_utilization": 0.45})
    assert len(fake_vllm) == 1
