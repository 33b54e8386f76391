"""`specrun chat` as people and scripts run it: a real pseudo-terminal (pexpect) and pipes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specrun.cli.chat import INSTRUCT_EXAMPLE
from specrun.hub.profiles import builtin_profiles_dir, load_profiles

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PROMPT = "you> "


def env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "LINES": "50"}


def chat_piped(*args, stdin):
    return subprocess.run(
        [sys.executable, "-m", "specrun", "chat", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
    )


def test_piped_two_messages_two_replies_and_exit_0(tiny, tmp_path):
    saved = tmp_path / "chat.json"
    result = chat_piped(
        "--target",
        tiny["target"],
        "--lookup",
        "--ctx-size",
        512,
        "-n",
        24,
        "--threads",
        1,
        stdin=f"the cat sat on the\nand the dog\n/save {saved}\n",
    )
    assert result.returncode == 0, result.stderr
    turns = json.loads(saved.read_text())["turns"]
    assert len(turns) == 2
    # stdout is exactly the replies, each ending its line; stats went to stderr
    assert result.stdout == "".join(t["assistant"].lstrip() + "\n" for t in turns)
    stat_lines = [line for line in result.stderr.splitlines() if "stop:" in line]
    assert len(stat_lines) == 2 and all("prefilled" in line for line in stat_lines)
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert "has no chat template, so it is likely a base model" in notes[0]
    assert notes[1].startswith(f"note: to chat, give an instruct model: --target {INSTRUCT_EXAMPLE} ")
    assert re.search(r"^session: 2 replies", result.stderr, re.M)


def test_the_model_the_base_model_note_suggests_is_an_instruct_alias():
    profile = load_profiles([builtin_profiles_dir()])[INSTRUCT_EXAMPLE]
    assert "instruct" in profile.repo.lower()


def test_piped_multi_line_message(tiny, tmp_path):
    saved = tmp_path / "chat.json"
    stdin = f'the cat \\\nsat\n"""\none\ntwo\n"""\n/save {saved}\n'
    result = chat_piped("--target", tiny["target"], "-n", 4, "--ctx-size", 256, "--threads", 1, stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert [t["user"] for t in json.loads(saved.read_text())["turns"]] == ["the cat \nsat", "one\ntwo"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--chat-format", "nope", "-n", "8"], "unknown --chat-format 'nope'"),
        (["--max-tokens", "300"], "--max-tokens has to be at most half the context (256 tokens"),
    ],
)
def test_bad_options_are_one_line_errors(tiny, args, fragment):
    result = chat_piped("--target", tiny["target"], "--ctx-size", 512, *args, stdin="hi\n")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and fragment in lines[-1] and "Traceback" not in result.stderr


def test_piped_unknown_command_stops_the_script_with_an_error(tiny):
    result = chat_piped("--target", tiny["target"], "-n", 8, "--ctx-size", 256, "--threads", 1, stdin="/frobnicate\n")
    assert result.returncode == 2 and "error: unknown command /frobnicate" in result.stderr


def spawn(*args):
    """chat in a real pseudo-terminal; only these tests need pexpect, so only they skip without it."""
    pexpect = pytest.importorskip("pexpect", reason="the terminal tests drive chat through pexpect (in specrun's test extra)")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "specrun", "chat", *map(str, args)],
        env=env(),
        encoding="utf-8",
        timeout=300,
        dimensions=(50, 200),
    )
    child.expect_exact(PROMPT)
    return child


def expect_reply_text(child, text: str) -> None:
    """Wait for `text` in the panel, where each token's colour puts escape codes between its pieces."""
    between = f"(?:{ANSI.pattern})*"
    child.expect(between.join(re.escape(char) for char in text))


def until_prompt(child) -> str:
    child.expect_exact(PROMPT)
    return ANSI.sub("", child.before)


def test_terminal_chat_panel_commands_and_quit(tiny):
    child = spawn("--target", tiny["target"], "--draft", tiny["draft"], "--k", 4, "--ctx-size", 512, "-n", 24, "--threads", 1)
    child.sendline("the cat sat on the mat")
    panel = until_prompt(child)
    for field in (
        "target.gguf ← draft.gguf",
        "k 4",
        "accepted",
        "this reply",
        "session",
        "mean accepted length",
        "tok/s",
        "vs plain",
        "calibrated at start",
        "time: draft",
        "verify",
        "prefilled",
        "first token after",
        "draft guess, accepted",
        "target's own token",
    ):
        assert field in panel, field
    child.sendline("/k 2")
    assert "k = 2 from the next reply on" in until_prompt(child)
    child.sendline("/k zero")
    assert "error: /k has to be an integer >= 1, 'auto' or 'llama.cpp', but is 'zero'" in until_prompt(child)
    child.sendline("and the dog")
    second = until_prompt(child)
    assert "k 2" in second
    prefilled = re.findall(r"prefilled (\d+) of (\d+) prompt tokens", second)[-1]
    assert int(prefilled[0]) < int(prefilled[1]) / 2  # the first turn came from the cache
    child.sendline("/stats")
    stats = until_prompt(child)
    assert "session: 2 replies" in stats and "prefilled" in stats and "first token" in stats
    child.sendline("/help")
    assert "/save FILE" in until_prompt(child)
    child.sendline("/quit")
    assert "session: 2 replies" in ANSI.sub("", child.read())  # read() runs to the end of output
    child.close()
    assert child.exitstatus == 0


def test_ctrl_d_leaves_with_a_summary(tiny):
    child = spawn("--target", tiny["target"], "--lookup", "-n", 8, "--ctx-size", 256, "--threads", 1)
    child.sendeof()
    assert "session: 0 replies" in ANSI.sub("", child.read())
    child.close()
    assert child.exitstatus == 0


@pytest.mark.gemma
def test_ctrl_c_stops_a_long_reply_and_keeps_it(gemma, tmp_path):
    # Gemma 3 270M (base) counts on and on (from 1 again), on one line: a reply that runs to -n unless stopped,
    # however fast the machine, since no turn marker ever starts a line of it.
    child = spawn("--lookup", "-n", 2000, "--threads", 1)
    child.sendline("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,")
    child.expect_exact("prompt lookup")  # the panel is drawing
    expect_reply_text(child, "15, 16,")  # ... the reply, past the message: it is streaming
    child.sendintr()
    # The final frame, drawn whole before the prompt comes back (within seconds), ends with the turn's stop reason.
    child.expect_exact(PROMPT, timeout=30)
    panel = ANSI.sub("", child.before)
    assert "stopped (Ctrl-C), kept what was written" in panel
    saved = tmp_path / "chat.json"
    child.sendline(f"/save {saved}")
    until_prompt(child)
    turn = json.loads(saved.read_text())["turns"][0]
    assert turn["stop_reason"] == "interrupted"
    assert 0 < turn["stats"]["tokens"] < 2000 and "15, 16," in turn["assistant"]
    child.sendline("/quit")
    child.read()
    child.close()
    assert child.exitstatus == 0


@pytest.mark.gemma
def test_a_base_model_reply_ends_at_the_next_turn_marker(gemma, tmp_path):
    # Gemma 3 270M (base) answers a question in the plain transcript by repeating it on "Assistant:" lines
    # (without the stop, until -n): the first new turn marker ends the reply.
    child = spawn("--lookup", "-n", 300, "--threads", 1)
    assert "likely a base model" in ANSI.sub("", child.before)  # the notes before the first prompt
    child.sendline("Write a Python function that returns the n-th Fibonacci number.")
    assert "stop string (next turn)" in until_prompt(child)
    saved = tmp_path / "chat.json"
    child.sendline(f"/save {saved}")
    until_prompt(child)
    turn = json.loads(saved.read_text())["turns"][0]
    assert turn["stop_reason"] == "stop_string" and turn["stats"]["tokens"] < 300
    assert turn["assistant"].strip() and "Assistant:" not in turn["assistant"]
    child.sendline("/quit")
    child.read()
    child.close()
    assert child.exitstatus == 0
