"""ddlrun's writing of rank output (keras_ddl_launcher/rank_output.py) on byte
streams: Keras-style progress bars (backspaces, carriage returns, ANSI
colours), reads cut anywhere, into a file or a pipe and onto a terminal;
TensorFlow's start-up lines left out (startup_lines.py) and nothing else;
and one real ddlrun launch whose rank draws a Keras progress bar, among
TensorFlow's real start-up lines (hidden) and its own stderr lines (not).
(--verbose showing them is checked in test_ddlrun_racks.py's launch.)"""

import os
import subprocess
import sys

import pytest

from keras_ddl_launcher.rank_output import ERASE_TO_END, MAX_LINE, RankOutput, Screen
from keras_ddl_launcher.startup_lines import NOTE, StartupLines

BOLD, GREEN, RESET = b"\x1b[1m", b"\x1b[32m", b"\x1b[0m"


def keras_bar(steps, widths=None):
    """The bytes Keras 3's Progbar writes for ``steps`` updates: each redraw
    is backspaces over the previous one, a carriage return, the bar (with
    colour codes) padded to the previous width; the last ends the line."""
    out, previous = [], 0
    for step in range(1, steps + 1):
        bar = BOLD + f"{step}/{steps}".encode() + RESET + b" " + GREEN + \
            "━".encode() * step + RESET + f" - loss: {1.0 / step:.4f}".encode()
        width = len(bar)
        text = b"\b" * previous + b"\r" + bar + b" " * max(0, previous - width)
        if step == steps:
            text += b"\n"
        out.append(text)
        previous = width
    return out


def final_bar(steps):
    return BOLD + f"{steps}/{steps}".encode() + RESET + b" " + GREEN + \
        "━".encode() * steps + RESET + f" - loss: {1.0 / steps:.4f}".encode()


def feed_all(stream, chunks):
    return b"".join(stream.feed(c) for c in chunks) + stream.rest()


def cut_every(data, n):
    return [data[i:i + n] for i in range(0, len(data), n)]


@pytest.mark.parametrize("chunk", [None, 1, 7, 64])
def test_into_a_file_a_bar_is_one_line_in_its_final_state(chunk):
    writes = [b"Epoch 1/2\n"] + keras_bar(5) + [b"Epoch 2/2\n"] + keras_bar(3) + [b"done\n"]
    data = b"".join(writes)
    chunks = writes if chunk is None else cut_every(data, chunk)
    out = feed_all(RankOutput(b"[0] "), chunks)
    assert out.split(b"\n") == [b"[0] Epoch 1/2", b"[0] " + final_bar(5), b"[0] Epoch 2/2",
                                b"[0] " + final_bar(3), b"[0] done", b""]
    assert b"\r" not in out and b"\b" not in out


def test_into_a_file_nothing_of_a_bar_is_written_before_its_line_ends():
    stream = RankOutput(b"[1] ")
    bar = keras_bar(4)
    assert b"".join(stream.feed(c) for c in bar[:-1]) == b""
    assert stream.feed(bar[-1]) == b"[1] " + final_bar(4) + b"\n"


def test_into_a_file_an_unfinished_bar_is_kept_at_the_end_of_the_stream():
    stream = RankOutput(b"[2] ")
    for c in keras_bar(6)[:3]:
        stream.feed(c)
    rest = stream.rest()
    assert rest.startswith(b"[2] " + BOLD + b"3/6") and rest.endswith(b"\n")
    assert b"\r" not in rest and rest.count(b"\n") == 1


def test_plain_lines_are_unchanged_with_and_without_prefix():
    data = b"alpha\nbe" + b"ta\n\ngam"
    assert feed_all(RankOutput(b"[3] "), cut_every(data, 3)) == \
        b"[3] alpha\n[3] beta\n[3] \n[3] gam\n"
    assert feed_all(RankOutput(), [data]) == b"alpha\nbeta\n\ngam\n"


def test_a_line_ending_in_a_carriage_return_keeps_its_text():
    assert feed_all(RankOutput(b"[0] "), [b"50%\r", b"100%\r", b"\n"]) == b"[0] 100%\n"


def test_a_very_long_run_without_newline_is_written_as_it_is():
    stream = RankOutput(b"[0] ")
    out = stream.feed(b"x" * MAX_LINE)
    assert out == b"[0] " + b"x" * MAX_LINE + b"\n"


def test_on_a_terminal_a_bar_redraws_in_place_with_its_prefix():
    screen = Screen()
    stream = RankOutput(b"[0] ", screen)
    out = [stream.feed(c) for c in [b"Epoch 1/1\n"] + keras_bar(3)]
    assert out[0] == b"[0] Epoch 1/1\n"
    first, second, last = out[1:]
    assert first == b"[0] " + BOLD + b"1/3" + RESET + b" " + GREEN + "━".encode() + RESET + \
        b" - loss: 1.0000" + ERASE_TO_END  # the first draw starts the line
    assert second.startswith(b"\r[0] " + BOLD + b"2/3") and second.endswith(ERASE_TO_END)
    assert b"\b" not in second and second.count(b"\r") == 1
    assert last == b"\r[0] " + final_bar(3) + ERASE_TO_END + b"\n"
    assert screen.owner is None


def test_on_a_terminal_a_cut_escape_or_character_is_not_drawn_half():
    stream = RankOutput(b"[0] ", Screen())
    bar = keras_bar(2)[1]
    cut_escape = bar.index(GREEN) + 2            # inside "\x1b[32m"
    out = stream.feed(keras_bar(2)[0]) and stream.feed(bar[:cut_escape])
    assert out.endswith(b" " + ERASE_TO_END), out  # stops before the escape
    stream2 = RankOutput(b"", Screen())
    stream2.feed(b"\r")
    assert stream2.feed("━".encode()[:2]) == b"\r" + ERASE_TO_END
    assert stream2.feed("━".encode()[2:]) == b"\r" + "━".encode() + ERASE_TO_END


def test_on_a_terminal_another_rank_ends_the_bar_line_before_writing():
    screen = Screen()
    rank0, rank1 = RankOutput(b"[0] ", screen), RankOutput(b"[1] ", screen)
    bar = keras_bar(3)
    assert rank0.feed(bar[0]).startswith(b"[0] ")
    assert rank1.feed(b"warning\n") == b"\n[1] warning\n"   # the bar's line is ended first
    assert rank0.feed(bar[1]).startswith(b"[0] " + BOLD + b"2/3")  # a new line, no \r
    assert rank0.feed(bar[2]).startswith(b"\r[0] " + BOLD + b"3/3")
    assert rank1.feed(b"after\n") == b"[1] after\n"           # the bar ended its own line


def test_on_a_terminal_plain_lines_are_whole_and_not_drawn_early():
    stream = RankOutput(b"[4] ", Screen())
    assert stream.feed(b"half") == b""
    assert stream.feed(b" line\n") == b"[4] half line\n"


# TensorFlow 2.21's start-up lines on a machine without a GPU driver, as
# one rank writes them to stderr (the launch below checks the real ones).
TF_STARTUP = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"I0000 00:00:1796617428.961109   17639 port.cc:153] oneDNN custom operations are on. "
    b"You may see slightly different numerical results due to floating-point round-off errors "
    b"from different computation orders. To turn them off, set the environment variable "
    b"`TF_ENABLE_ONEDNN_OPTS=0`.",
    b"I0000 00:00:1796617428.961402   17639 cudart_stub.cc:31] Could not find cuda drivers on "
    b"your machine, GPU will not be used.",
    b"I0000 00:00:1796617429.068042   17639 cpu_feature_guard.cc:227] This TensorFlow binary is "
    b"optimized to use available CPU instructions in performance-critical operations.",
    b"To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild "
    b"TensorFlow with the appropriate compiler flags.",
    b"E0000 00:00:1796617434.981932   17639 cuda_platform.cc:52] failed call to cuInit: "
    b"INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    # TF 2.15's header, and a CUDA install's duplicate registrations
    b"2024-01-05 10:00:00.123456: I tensorflow/core/util/port.cc:113] oneDNN custom operations "
    b"are on. You may see slightly different numerical results.",
    b"E0000 00:00:1796617434.1   17639 cuda_fft.cc:485] Unable to register cuFFT factory: "
    b"Attempting to register factory for plugin cuFFT when one has already been registered",
    b"W0000 00:00:1796617434.2   17639 py_utils.cc:38] TF-TRT Warning: Could not find TensorRT",
]
# A user's lines, some shaped like TensorFlow's: every one passes.
USER_LINES = [
    b"W0000 00:00:1796617434.3   17639 train.py:12] my own warning",
    b"To enable the following instructions: mine, in other operations, rebuild TensorFlow "
    b"with the appropriate compiler flags.",  # not after the CPU-feature notice
    b"oneDNN custom operations are on. (quoted by the user, without a log header)",
    b"E0000 00:00:1796617434.4   17639 cuda_platform.cc:52] failed call to cuInit: "
    b"CUDA_ERROR_NO_DEVICE",  # on a rank that found a driver: an error worth seeing
    b"Traceback (most recent call last):",
]


def test_tensorflow_startup_lines_are_hidden_with_one_note_and_nothing_else():
    run = StartupLines()
    rank0 = RankOutput(b"[0] ", hide=run.stream())
    rank1 = RankOutput(b"[1] ", hide=run.stream())
    out0 = feed_all(rank0, [b"\n".join(TF_STARTUP) + b"\n"])
    assert out0 == NOTE  # the note in the first hidden line's place
    out1 = feed_all(rank1, [line + b"\n" for line in TF_STARTUP])
    assert out1 == b""  # once per run, not per rank
    assert run.hidden == 2 * len(TF_STARTUP)
    # A rank with a CUDA driver: its cuInit failure is shown.
    rank2 = RankOutput(b"[2] ", hide=run.stream())
    assert feed_all(rank2, [b"\n".join(USER_LINES + TF_STARTUP[:1]) + b"\n"]) == \
        b"".join(b"[2] " + line + b"\n" for line in USER_LINES)


def test_verbose_hides_nothing():
    run = StartupLines(show=True)
    assert run.stream() is None
    out = feed_all(RankOutput(b"[0] ", hide=run.stream()), [b"\n".join(TF_STARTUP) + b"\n"])
    assert out == b"".join(b"[0] " + line + b"\n" for line in TF_STARTUP)


def test_a_hidden_line_ends_another_streams_bar_on_the_terminal_before_the_note():
    screen, run = Screen(), StartupLines()
    bar = RankOutput(b"[0] ", screen)
    startup = RankOutput(b"[1] ", screen, hide=run.stream())
    assert bar.feed(b"\r1/4").endswith(ERASE_TO_END)
    assert startup.feed(TF_STARTUP[0] + b"\n") == b"\n" + NOTE
    assert startup.feed(TF_STARTUP[1] + b"\n") == b""
    assert screen.owner is None


BAR_SCRIPT = """
import sys
import keras, numpy as np
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 0:
    bar = keras.utils.Progbar(4, interval=0)
    for step in range(1, 5):
        bar.update(step, [("loss", 1.0 / step)])
sys.stderr.write("W0000 00:00:1.5  77 bar.py:8] the user's own warning\\n")
print("END", flush=True)
"""
# What TensorFlow's start-up lines contain (any TensorFlow 2.x).
STARTUP_WORDS = (b"absl::InitializeLog", b"oneDNN custom operations", b"cuda drivers",
                 b"cpu_feature_guard", b"To enable the following instructions")


def test_ddlrun_writes_one_line_per_keras_bar_into_a_pipe(tmp_path):
    script = tmp_path / "bar.py"
    script.write_text(BAR_SCRIPT)
    # TensorFlow's own log level (0, its default): its start-up lines are written.
    proc = subprocess.run([sys.executable, "-m", "keras_ddl_launcher.ddlrun", "-np", "2",
                           sys.executable, str(script)], capture_output=True, timeout=180,
                          cwd=tmp_path, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Hidden, and said once; the user's own stderr lines pass.
    assert proc.stderr.count(NOTE) == 1, proc.stderr[-3000:]
    assert not [w for w in STARTUP_WORDS if w in proc.stdout + proc.stderr], proc.stderr[-3000:]
    assert sorted(line for line in proc.stderr.split(b"\n") if b"user's own" in line) == \
        [b"[%d] W0000 00:00:1.5  77 bar.py:8] the user's own warning" % r for r in (0, 1)]
    lines = proc.stdout.split(b"\n")
    bars = [line for line in lines if b"4/4" in line]
    assert len(bars) == 1, proc.stdout
    assert bars[0].startswith(b"[0] ") and b"\r" not in bars[0] and b"\b" not in bars[0]
    assert b"1/4" not in proc.stdout and b"3/4" not in proc.stdout  # earlier redraws dropped
    assert sorted(line for line in lines if line.endswith(b"END")) == [b"[0] END", b"[1] END"]


def test_a_terminal_gets_one_shared_screen_and_a_pipe_none():
    from keras_ddl_launcher.rank_output import screens_for
    master, slave = os.openpty()
    read_end, write_end = os.pipe()
    try:
        both = screens_for(slave, slave)
        assert both["stdout"] is not None and both["stdout"] is both["stderr"]
        mixed = screens_for(slave, write_end)
        assert mixed["stdout"] is not None and mixed["stderr"] is None
        assert screens_for(write_end, write_end) == {"stdout": None, "stderr": None}
    finally:
        for fd in (master, slave, read_end, write_end):
            os.close(fd)
