"""The edge between pipeline stages: the chunk rule, the file as it grows, giving up."""

from __future__ import annotations

import threading

import pytest

from omni_ray.engines import handover


def test_without_a_window_one_chunk_is_the_whole_input_and_output():
    assert handover.chunk_plan(16, 8, None) == [(16, 8)]


def test_a_window_reads_the_input_in_chunks_and_shares_the_output_between_them():
    assert handover.chunk_plan(16, 16, 4) == [(4, 4), (8, 4), (12, 4), (16, 4)]
    assert handover.chunk_plan(8, 16, 4) == [(4, 8), (8, 8)]


@pytest.mark.parametrize("input_len,output_len,window", [(16, 8, 3), (16, 5, 8)])
def test_a_window_that_does_not_divide_is_refused(input_len, output_len, window):
    with pytest.raises(ValueError, match=f"window {window} must divide"):
        handover.chunk_plan(input_len, output_len, window)


def test_the_outbox_writes_each_time_every_row_passed_another_window(tmp_path):
    path = str(tmp_path / "edge.json")
    clock = iter(range(100))
    box = handover.Outbox(path, 4, clock=lambda: next(clock))
    box([[1, 2, 3], [1, 2, 3]])
    assert handover.read_edge(path) is None  # 3 tokens: no chunk yet
    box([[1, 2, 3, 4, 5], [1, 2, 3, 4]])
    assert handover.read_edge(path) == {"token_ids": [[1, 2, 3, 4, 5], [1, 2, 3, 4]],
                                        "final": False}
    box([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5]])  # still the first chunk for the second row
    assert handover.read_edge(path)["token_ids"][1] == [1, 2, 3, 4]
    box([[9] * 8, [9] * 8])
    box([[9] * 8, [9] * 8], final=True)
    assert handover.read_edge(path) == {"token_ids": [[9] * 8, [9] * 8], "final": True}
    assert box.sent_at == [0, 1]


def test_a_chunks_time_is_read_before_a_reader_can_see_it(tmp_path):
    # the next stage stamps a chunk when it sees the file: the sender's stamp must not be later
    path = str(tmp_path / "edge.json")
    seen = []
    box = handover.Outbox(path, 2, clock=lambda: seen.append(handover.read_edge(path)) or 0.0)
    box([[1, 2]])
    box([[1, 2, 3, 4]])
    assert seen == [None, {"token_ids": [[1, 2]], "final": False}]


def test_without_a_window_the_outbox_writes_once_when_final(tmp_path):
    path = str(tmp_path / "edge.json")
    box = handover.Outbox(path, None)
    box([[1] * 40])
    assert handover.read_edge(path) is None
    box([[1] * 40], final=True)
    assert handover.read_edge(path)["final"] is True


def test_a_reader_waits_for_its_chunk_as_the_file_grows(tmp_path):
    path = str(tmp_path / "edge.json")
    handover.write_tokens(path, [[1, 2]], final=False)
    got = []
    reader = threading.Thread(target=lambda: got.append(handover.wait_for_tokens(path, 4)))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not got  # 2 of the 4 tokens it needs
    handover.write_tokens(path, [[1, 2, 3, 4, 5]], final=False)
    reader.join(30)
    assert got == [[[1, 2, 3, 4]]]


def test_a_reader_gives_up_on_an_error_or_an_input_that_ended_short(tmp_path):
    path = tmp_path / "edge.json"
    path.write_text('{"error": "stage 0 failed"}')
    with pytest.raises(RuntimeError, match="no input: stage 0 failed"):
        handover.wait_for_tokens(str(path), 4)
    handover.write_tokens(str(path), [[1, 2]], final=True)
    with pytest.raises(RuntimeError, match="input ended at 2 tokens, short of 4"):
        handover.wait_for_tokens(str(path), 4)


def test_chunks_interleave_with_the_output_so_far():
    prompt = handover.interleave([[]], handover.map_tokens([[2050, 3]], 2048))
    prompt = handover.interleave(prompt, [[7]])          # o1
    assert handover.interleave(prompt, [[4, 5]]) == [[2, 3, 7, 4, 5]]


# A serving pipeline's inboxes: JSON lines, appended as requests come and go.

def test_an_inbox_is_read_by_whole_lines_as_it_grows(tmp_path):
    path = str(tmp_path / "s1.in.jsonl")
    reader = handover.LineReader(path)
    assert reader.read() == []  # before it exists
    write = handover.LineWriter(path)
    write({"id": "load0.0", "tokens": [1, 2], "final": False})
    with open(path, "a") as f:
        f.write('{"id": "load0.1", "tok')  # a line being written waits for its end
    assert reader.read() == [{"id": "load0.0", "tokens": [1, 2], "final": False}]
    with open(path, "a") as f:
        f.write('ens": [], "final": true}\n')
    handover.append_line(path, {"error": "stage 2 failed"})  # the launcher's, beside the writer
    assert reader.read() == [{"id": "load0.1", "tokens": [], "final": True},
                             {"error": "stage 2 failed"}]
    assert reader.read() == []
    write.close()


def test_a_request_outbox_hands_on_whole_windows_then_the_rest_when_final():
    lines = []
    out = handover.RequestOutbox(lines.append, window=4)
    assert not out("a", 8, [1, 2, 3])
    assert out("a", 8, [1, 2, 3, 4, 5])
    assert not out("a", 8, [1, 2, 3, 4, 5, 6])
    assert out("b", 8, [9, 9, 9, 9])  # requests are counted apart
    assert out("a", 8, [1, 2, 3, 4, 5, 6, 7, 8], final=True)
    assert lines == [{"id": "a", "output_len": 8, "tokens": [1, 2, 3, 4], "final": False},
                     {"id": "b", "output_len": 8, "tokens": [9, 9, 9, 9], "final": False},
                     {"id": "a", "output_len": 8, "tokens": [5, 6, 7, 8], "final": True}]
    assert out.sent == {"b": 4}


def test_without_a_window_a_request_goes_on_once_whole():
    lines = []
    out = handover.RequestOutbox(lines.append, window=None)
    assert not out("a", 3, [1, 2])
    assert out("a", 3, [1, 2, 3], final=True)
    assert lines == [{"id": "a", "output_len": 3, "tokens": [1, 2, 3], "final": True}]
