"""The llama.cpp engine's figures from llama-bench's JSON, against a stand-in llama-bench (a
script that answers like it): the metric names vLLM's records use, medians over repetitions,
the command it runs, the pinning read back while it runs. Nothing is built here."""

from __future__ import annotations

import json
import stat
import sys
import types
from pathlib import Path

import pytest

from omni_ray.config import StageConfig, WorkloadConfig
from omni_ray.engines import Session, load_engine
from omni_ray.engines.request import EngineRequest

FIXTURE = Path(__file__).resolve().parents[1] / "peers" / "fixtures" / "llama_bench_tiny_q4_0.json"

# Answers one test like llama-bench -o json, one row per thread count and -fa setting: at 2
# threads with the test's faster setting (prefill: -fa on, decode: -fa off) samples 100, 300,
# 200 tok/s for prefill (-n 0) and 10, 30, 20 for decode; less at every other setting. The argv
# is kept beside it for the test to read.
FAKE = """#!{python}
import json, sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
base = json.load(open({fixture!r}))[0]
rows = []
for t in value("-t").split(","):
    for fa in (value("-fa") if "-fa" in args else "auto").split(","):
        row = dict(base, n_prompt=int(value("-p")), n_gen=int(value("-n")),
                   n_depth=int(value("-d")) if "-d" in args else 0, n_threads=int(t),
                   flash_attn={{"on": 1, "off": 0, "auto": -1}}[fa])
        prefill = row["n_gen"] == 0
        scale = int(t) / 2 * (1.0 if (fa == "on") == prefill else 0.5)
        row["samples_ts"] = [x * scale for x in ([100.0, 300.0, 200.0] if prefill
                                                 else [10.0, 30.0, 20.0])]
        row["avg_ts"] = sum(row["samples_ts"]) / 3
        rows.append(row)
open({argv_log!r}, "a").write(json.dumps(args) + "\\n")
print(json.dumps(rows))
"""

# Answers like omni-logprobs: reads the ids file, gives each id i+1 the log-probability
# -(7 + shift) - id/1e5 (shift: $FAKE_SHIFT, 0 if unset) and greedy id 1132 throughout.
FAKE_PROBE = """#!{python}
import json, os, sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
ids = [int(t) for t in open(value("--ids")).read().split()]
shift = float(os.environ.get("FAKE_SHIFT", "0"))
open({argv_log!r}, "a").write(json.dumps(args) + "\\n")
print(json.dumps({{"n_vocab": 2048, "logprobs": [-(7 + shift) - t / 1e5 for t in ids[1:]],
                  "greedy_ids": [1132] * int(value("--tokens"))}}))
"""


class Sampler:
    def __init__(self) -> None:
        self.marks: list[str] = []

    def mark(self, label: str) -> None:
        self.marks.append(label)

    def peak_anon_mb(self, start=None, end=None) -> float:
        return {("decode_start", "decode_end"): 42.0}.get((start, end), 50.0)


@pytest.fixture
def engine(tmp_path):
    argv_log = tmp_path / "argv.jsonl"
    bench = tmp_path / "llama-bench"
    bench.write_text(FAKE.format(python=sys.executable, fixture=str(FIXTURE),
                                 argv_log=str(argv_log)))
    bench.chmod(bench.stat().st_mode | stat.S_IEXEC)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"\0" * 4096)
    probe = tmp_path / "omni-logprobs"
    probe.write_text(FAKE_PROBE.format(python=sys.executable,
                                       argv_log=str(tmp_path / "probe-argv.jsonl")))
    probe.chmod(probe.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "config.json").write_text('{"vocab_size": 2048}')
    eng = load_engine("llamacpp")()
    eng.llama = types.SimpleNamespace(llama_bench=bench, omni_logprobs=probe,
                                      as_dict=lambda: {"version": "x"})
    eng.gguf = gguf
    return eng, argv_log


def test_llamacpp_reports_vllms_metric_names_as_medians(engine, tmp_path):
    eng, argv_log = engine
    req = EngineRequest(stage=StageConfig(model="tiny", engine="llamacpp", quantization="Q4_0"),
                        workload=WorkloadConfig(prompt_len=64, output_len=8, repeats=3,
                                                warmup=0, detokenize=False), cpus=(0, 1))
    reads = []
    session = Session(req, str(tmp_path), Sampler(), lambda: reads.append(1))
    m = eng.run(session)
    assert m["prefill_tok_s"] == 200.0 and m["ttft_s"] == pytest.approx(64 / 200.0)
    assert m["decode_tok_s"] == 20.0 and m["decode_ms_per_token"] == pytest.approx(50.0)
    assert m["rss_anon_tree_mb"] == 42.0  # the tree's peak while the decode test ran
    assert m["decode_weight_bytes_per_token"] == 4096
    assert len(m["engine_pids"]) == 2 and reads  # pinning read while llama-bench ran
    assert session.sampler.marks == ["prefill_start", "prefill_end", "decode_start", "decode_end"]
    prefill, decode = [json.loads(line) for line in argv_log.read_text().splitlines()]
    # weights into anonymous memory, no warm-up when warmup is 0, and the settings users tune:
    # half and all of the slot's CPUs as threads, flash attention on and off
    for argv in (prefill, decode):
        assert argv[argv.index("-lm") + 1] == "none" and argv[argv.index("-t") + 1] == "1,2"
        assert argv[argv.index("-fa") + 1] == "on,off"
        assert "--no-warmup" in argv and argv[argv.index("-r") + 1] == "3"
    # each test's figure is its fastest setting's, and the record says which won of what
    assert m["llamacpp_prefill_setting"] == "-fa on -t 2"
    assert m["llamacpp_setting"] == "-fa off -t 2"
    assert len(m["llamacpp_tried"]["decode"]) == 4
    assert max(t["avg_ts"] for t in m["llamacpp_tried"]["decode"]) == 20.0
    assert (prefill[prefill.index("-p") + 1], prefill[prefill.index("-n") + 1]) == ("64", "0")
    assert "-d" not in prefill
    # decode after prompt_len tokens of context, as vLLM's decode by difference
    assert (decode[decode.index("-p") + 1], decode[decode.index("-n") + 1],
            decode[decode.index("-d") + 1]) == ("0", "8", "64")


def test_engine_args_narrow_the_settings_tried(engine, tmp_path):
    eng, argv_log = engine
    stage = StageConfig(model="tiny", engine="llamacpp",
                        engine_args={"flash_attn": True, "threads": [2]})  # YAML's bare `on`
    req = EngineRequest(stage=stage, workload=WorkloadConfig(prompt_len=64, output_len=8,
                                                             detokenize=False), cpus=(0, 1))
    m = eng.run(Session(req, str(tmp_path), Sampler(), lambda: None))
    argv = json.loads(argv_log.read_text().splitlines()[0])
    assert (argv[argv.index("-t") + 1], argv[argv.index("-fa") + 1]) == ("2", "on")
    # decode's faster setting was not tried: its figure is the one setting's
    assert m["llamacpp_setting"] == "-fa on -t 2" and m["decode_tok_s"] == 10.0


def test_more_threads_than_the_slot_has_is_an_error(engine, tmp_path):
    eng, _ = engine
    stage = StageConfig(model="tiny", engine="llamacpp", engine_args={"threads": [4]})
    req = EngineRequest(stage=stage, workload=WorkloadConfig(detokenize=False), cpus=(0, 1))
    with pytest.raises(RuntimeError, match=r"threads \[4\]: the slot has 2 CPU"):
        eng.run(Session(req, str(tmp_path), Sampler(), lambda: None))


def test_a_failing_llama_bench_raises_with_its_stderr(engine, tmp_path):
    eng, _ = engine
    eng.llama.llama_bench.write_text("#!/bin/sh\necho 'bad model file' >&2\nexit 3\n")
    req = EngineRequest(stage=StageConfig(model="tiny", engine="llamacpp"),
                        workload=WorkloadConfig(detokenize=False))
    with pytest.raises(RuntimeError, match=r"llama-bench prefill exited with 3: bad model file"):
        eng.run(Session(req, str(tmp_path), Sampler(), lambda: None))


def test_every_engine_is_found_by_its_config_name():
    from omni_ray.config.schema import ENGINES

    assert [load_engine(name).name for name in ENGINES] == list(ENGINES)


def test_gguf_cache_key_follows_the_content(tmp_path, monkeypatch):
    from omni_ray.peers import llamacpp

    monkeypatch.setenv("OMNI_RAY_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    llama = types.SimpleNamespace(source_digest="s1")
    first = llamacpp.gguf_path(model, "bfloat16", "Q4_0", llama)
    assert first.name == "model-bf16-Q4_0.gguf"
    assert llamacpp.gguf_path(model, "bfloat16", None, llama).parent == first.parent
    (model / "config.json").write_text('{"changed": 1}')
    assert llamacpp.gguf_path(model, "bfloat16", "Q4_0", llama) != first
    other_source = types.SimpleNamespace(source_digest="s2")
    assert llamacpp.gguf_path(model, "bfloat16", "Q4_0", other_source).parent != \
        llamacpp.gguf_path(model, "bfloat16", "Q4_0", llama).parent


def _quality_run(engine, tmp_path, quantization):
    eng, _ = engine
    req = EngineRequest(stage=StageConfig(model="tiny", engine="llamacpp",
                                          quantization=quantization),
                        workload=WorkloadConfig(prompt_len=64, output_len=8, repeats=3, warmup=0,
                                                detokenize=False,
                                                quality={"tokens": 4, "sequence_len": 16}),
                        cpus=(0, 1))
    session = Session(req, str(tmp_path), Sampler(), lambda: None)
    return eng.run(session), session


def test_quality_probe_runs_after_the_speed_with_the_decode_setting(engine, tmp_path):
    from omni_ray.workload.quality import ids_digest, probe_ids

    m, session = _quality_run(engine, tmp_path, "Q4_0")
    assert session.sampler.marks[-2:] == ["quality_start", "quality_end"]  # after decode
    (argv,) = [json.loads(line) for line in (tmp_path / "probe-argv.jsonl").read_text()
               .splitlines()]
    # the decode run's winner (-fa off -t 2), on the arm's GGUF
    assert (argv[argv.index("-t") + 1], argv[argv.index("-fa") + 1]) == ("2", "off")
    assert argv[argv.index("-m") + 1] == str(engine[0].gguf)
    assert argv[argv.index("--tokens") + 1] == "4"
    ids = probe_ids(2048, 16)  # drawn from config.json's vocab_size, as vLLM's arms draw them
    assert m["quality_ids_digest"] == ids_digest(ids) and m["quality_sequence_len"] == 16
    assert m["quality_logprobs"] == pytest.approx([-7 - t / 1e5 for t in ids[1:]])
    assert m["quality_greedy_ids"] == [1132] * 4
    assert m["quality_weights"] == "Q4_0"  # the GGUF's type: paired with the bf16 GGUF
    assert m["quality_source"] == str(tmp_path.resolve())
    assert len(m["engine_pids"]) == 3  # prefill, decode, the probe
    assert engine[0].runs[-1]["setting_label"] == "-fa off -t 2"


def test_a_q4_0_arm_pairs_with_the_bf16_gguf(engine, tmp_path, monkeypatch):
    from omni_ray.results.quality import pair

    bf16, _ = _quality_run(engine, tmp_path, None)
    monkeypatch.setenv("FAKE_SHIFT", "0.5")
    q4, _ = _quality_run(engine, tmp_path, "Q4_0")
    records = [{"arm": {"id": arm}, "status": "ok", "pass": 0, "measurements": m,
                "config": {"stage": {"engine": "llamacpp", "quantization": q}}}
               for arm, m, q in (("bf16", bf16, None), ("q4", q4, "Q4_0"))]
    (row,) = pair(records)
    assert (row["arm"], row["baseline"]) == ("q4", "bf16")
    assert row["mean_abs_dlogprob"] == pytest.approx(0.5)
    assert row["greedy_agreement"] == 1.0


def test_a_failing_probe_raises_with_its_stderr(engine, tmp_path):
    eng, _ = engine
    eng.llama.omni_logprobs.write_text(
        "#!/bin/sh\necho 'omni-logprobs: error: token id 4000 is outside' >&2\nexit 2\n")
    with pytest.raises(RuntimeError, match=r"omni-logprobs quality exited with 2: .*outside"):
        _quality_run(engine, tmp_path, None)
