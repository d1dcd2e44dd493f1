"""decode_pairs' pure parts: the pairwise summary, the peer's command, the argument checks."""

import time

import pytest

from omni_ray.bench import decode_pairs as dp


def test_summary_is_pairwise_and_flags_pairs_where_the_engine_was_busy():
    tok_s = {dp.VLLM: [90.0, 110.0, 100.0], dp.PEER: [100.0, 100.0, 80.0]}
    s = dp.summarize(tok_s, engine_cpu=[0.01, 0.2, 0.0], peer_wall=[1.0, 1.0, 1.0])
    assert s["pairwise_ratios"] == pytest.approx([0.9, 1.1, 1.25])
    assert s["pairwise_ratio_median"] == pytest.approx(1.1)
    assert s["pairs_vllm_faster"] == 2
    assert s["median_tok_s"] == {dp.VLLM: 100.0, dp.PEER: 100.0}
    assert s["spread_pct"][dp.PEER] == pytest.approx(20.0)
    assert s["pairs_engine_busy_during_peer"] == [1]  # 0.2 s of CPU in 1 s is over the share


def test_the_peer_decodes_the_same_tokens_after_the_same_depth(monkeypatch, tmp_path):
    from omni_ray.peers import llamacpp

    seen = {}

    def fake_bench(gguf, **kw):
        seen.update(kw, gguf=gguf)
        return [{"avg_ts": 87.5}]

    monkeypatch.setattr(llamacpp, "bench", fake_bench)
    assert dp.peer_tok_s(tmp_path / "m.gguf", [0, 1], depth=128, output_len=64,
                         repetitions=1) == 87.5
    assert (seen["n_prompt"], seen["n_gen"], seen["n_depth"]) == ((0,), 64, (128,))
    assert (seen["threads"], seen["cpus"], seen["repetitions"]) == (2, [0, 1], 1)

    monkeypatch.setattr(llamacpp, "bench", lambda gguf, **kw: [])
    with pytest.raises(RuntimeError, match="returned 0 tests"):
        dp.peer_tok_s(tmp_path / "m.gguf", [0], depth=128, output_len=64, repetitions=1)


def test_engine_cpu_counts_this_process_work():
    before = dp.engine_cpu_s()
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert dp.engine_cpu_s() - before >= 0.04


@pytest.mark.parametrize("argv, message", [
    (["--pairs", "0"], "--pairs must be at least 1, got 0"),
    (["--output-len", "1"], "--output-len: decode by difference needs at least 2, got 1"),
    (["--depth", "0"], "--depth must be at least 1"),
    (["--gap", "-1"], "--spin-count and --gap must be >= 0"),
    (["--serial-kernels", "--eager"], "need a compiled engine; drop --eager"),
])
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        dp.main(argv)
    assert message in capsys.readouterr().err


def test_missing_model_files_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        dp.main(["--gguf", str(tmp_path / "no.gguf")])
    assert f"--gguf: no such file: {tmp_path / 'no.gguf'}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dp.main(["--model", str(tmp_path / "nope")])
    assert f"--model: not a checkpoint directory: {tmp_path / 'nope'}" in capsys.readouterr().err


def test_save_and_exit_keeps_the_result_and_its_command_before_exiting(tmp_path, monkeypatch,
                                                                       capsys):
    import json
    import os

    from omni_ray.bench import common

    def fake_exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    with pytest.raises(SystemExit) as done:
        common.save_and_exit(tmp_path, "decode_pairs", {"pairs": 3}, "omni_ray.bench.decode_pairs",
                             ["--pairs", "3"], "ratio 0.9")
    assert done.value.code == 0
    [path] = tmp_path.glob("*.json")
    saved = json.loads(path.read_text())
    assert saved["kind"] == "decode_pairs" and saved["pairs"] == 3
    assert saved["command"].endswith("-m omni_ray.bench.decode_pairs --pairs 3")
    assert capsys.readouterr().out.strip() == f"ratio 0.9  -> {path}"
    # the CPU every figure ran on, in one line: model; ISA; LLC (from sysfs)
    assert saved["hardware"].count("; ") == 2 and "; LLC " in saved["hardware"]


def test_the_peer_is_tuned_once_and_every_pair_uses_the_winner(monkeypatch, tmp_path):
    from omni_ray.peers import llamacpp

    calls = []

    def fake_bench(gguf, **kw):
        calls.append(kw)
        threads = (kw["threads"],) if isinstance(kw["threads"], int) else kw["threads"]
        return [{"kind": "tg", "n_prompt": 0, "n_gen": 64, "n_depth": 128, "avg_ts": ts,
                 "stddev_ts": 0.5, "flash_attn": fa, "threads": t}
                for fa, t, ts in ((1, 1, 20.0), (1, 2, 33.0), (0, 1, 19.0), (0, 2, 30.0))
                if t in threads and (not kw["flash_attn"] or
                                           llamacpp.flash_attn_name(fa) in kw["flash_attn"])]

    monkeypatch.setattr(llamacpp, "bench", fake_bench)
    tuned = dp.tune_peer(tmp_path / "m.gguf", [0, 1], depth=128, output_len=64, repetitions=1)
    assert tuned["setting"] == {"flash_attn": "on", "threads": 2} and len(tuned["tried"]) == 4
    assert dp.peer_tok_s(tmp_path / "m.gguf", [0, 1], depth=128, output_len=64, repetitions=1,
                         setting=tuned["setting"]) == 33.0
    assert (calls[-1]["threads"], calls[-1]["flash_attn"]) == (2, ("on",))
