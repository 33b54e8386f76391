"""Ctrl-C: a flag while a chat reply streams (not an exception thrown into whatever runs), and on
every program people run, an end within seconds."""

import os
import select
import signal
import subprocess
import sys
from typing import Callable

import pytest

from specrun.cli.interrupts import CtrlC

PROMPT = "the cat sat on the mat and the cat sat on the"


def test_the_first_ctrl_c_is_a_flag_and_the_second_interrupts():
    with CtrlC() as ctrl_c:
        assert not ctrl_c.pressed()
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the next line
        assert ctrl_c.pressed()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_leaving_restores_the_handler_it_found():
    with CtrlC():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


# --- Ctrl-C on the programs people run: each ends within seconds of the signal ---------------
ENDS_WITHIN_S = 30  # a Ctrl-C that has not ended the program by then is taken for a hang
LONG = ["-n", "30000", "-c", "32768", "-t", "1"]  # the endless tiny model writes for tens of seconds


def start(args: list[str], ready: Callable[[subprocess.Popen], bool]) -> subprocess.Popen:
    """A program, once `ready` says it is at work (it reads the program's first output)."""
    process = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert ready(process), process.stderr.read().decode() if process.poll() is not None else "not ready"
    return process


def printed(stream: str) -> Callable[[subprocess.Popen], bool]:
    """Ready once the program wrote anything on `stream`."""

    def ready(process: subprocess.Popen) -> bool:
        pipe = getattr(process, stream)
        return bool(select.select([pipe], [], [], 120)[0]) and bool(pipe.read1(1))

    return ready


def line(text: str, stream: str = "stdout") -> Callable[[subprocess.Popen], bool]:
    """Ready once the program printed `text` as a line on `stream`."""
    return lambda process: any(text == raw.decode().strip() for raw in iter(getattr(process, stream).readline, b""))


def interrupt(process: subprocess.Popen) -> tuple[int, str, str]:
    """Ctrl-C, then the exit status, the rest of stdout and stderr, failing if it goes on."""
    process.send_signal(signal.SIGINT)
    try:
        out, err = process.communicate(timeout=ENDS_WITHIN_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"still running {ENDS_WITHIN_S} s after Ctrl-C")
    return process.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def test_ctrl_c_ends_generate(tiny):
    process = start(["-m", "specrun", "generate", PROMPT, "--target", str(tiny["endless"]), "--lookup", *LONG], printed("stdout"))
    code, _, err = interrupt(process)
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted", err


def test_ctrl_c_ends_bench(tiny, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPT + "\n")
    process = start(
        [
            "-m",
            "specrun",
            "bench",
            str(prompts),
            "--target",
            str(tiny["endless"]),
            "--methods",
            "lookup",
            "--k",
            "4",
            "--warmup",
            "0",
            *LONG,
        ],
        printed("stderr"),
    )
    code, _, err = interrupt(process)
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted", err


PYTHON_USER = """
import sys
import specrun

with specrun.load(sys.argv[1], lookup=True, threads=1, n_ctx=4096) as session:
    try:
        while True:
            for n, event in enumerate(session.stream(sys.argv[2], 3000)):
                if n == 10:
                    print("streaming", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(f"then {len(session.generate('the cat', max_tokens=4).tokens)} tokens")
"""


def test_ctrl_c_in_a_python_user_leaves_the_session_usable(tiny):
    process = start(["-c", PYTHON_USER, str(tiny["target"]), PROMPT], line("streaming"))
    code, out, err = interrupt(process)
    assert code == 0 and [text for text in out.splitlines() if text != "streaming"] == ["interrupted", "then 4 tokens"], err
