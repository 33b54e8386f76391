"""Bad input to every command, as a table: one line naming the problem, exit 2, nothing written.

Each row is a command line and the fragments its one error line must hold (the option
and the value, or the file). Rows run in-process through the CLI boundary (`run_app`),
inside a folder whose contents must be the same afterwards; the faults only a real
process shows (stdin bytes, a broken llama-cpp-python) run as subprocesses.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tinyhybrid import write_tiny_mamba, write_tiny_qwen35
from tinymodels import write_tiny_llama

from specrun.cli import run_app

ROOT = Path(__file__).resolve().parent.parent
SAMPLING_COMMANDS = ("generate", "chat", "bench", "serve")

# (option, bad value, fragments of the error line) for options generate, chat and bench share.
SHARED_OPTIONS = [
    ("--temp", "-1", ["--temp", "-1", ">= 0"]),
    ("--temp", "nan", ["--temp", "nan"]),
    ("--temp", "inf", ["--temp", "inf"]),
    ("--temp", "warm", ["--temp", "'warm'", "number"]),
    ("--top-k", "-1", ["--top-k", "-1", ">= 0"]),
    ("--top-k", "1.5", ["--top-k", "'1.5'", "integer"]),
    ("--top-p", "0", ["--top-p", "(0, 1]", "but is 0"]),
    ("--top-p", "1.5", ["--top-p", "1.5"]),
    ("--min-p", "-0.1", ["--min-p", "-0.1", "[0, 1]"]),
    ("--min-p", "2", ["--min-p", "but is 2"]),
    ("--repeat-penalty", "0", ["--repeat-penalty", "from 0.01 to 100", "but is 0"]),
    ("--frequency-penalty", "3", ["--frequency-penalty", "from -2 to 2", "but is 3"]),
    ("--presence-penalty", "-2.5", ["--presence-penalty", "but is -2.5"]),
    ("--repeat-last-n", "-1", ["--repeat-last-n", "0 disables the penalties", "but is -1"]),
    ("--logit-bias", "15043", ["--logit-bias", "TOKEN_ID+BIAS", "but is '15043'"]),
    ("-l", "5+101", ["--logit-bias", "from -100 to 100", "but is 101"]),
    ("-l", "5+inf", ["--logit-bias", "-inf to ban", "but is inf"]),
    ("--xtc-probability", "2", ["--xtc-probability", "[0, 1]", "but is 2"]),
    ("--typical", "1.5", ["--typical", "[0, 1]", "but is 1.5"]),
    ("--dynatemp-exp", "-1", ["--dynatemp-exp", ">= 0", "but is -1"]),
    ("--top-nsigma", "inf", ["--top-nsigma", "but is inf"]),
    ("--xtc-threshold", "-0.1", ["--xtc-threshold", "above 0.5 disables it", "but is -0.1"]),
    ("--seed", "-1", ["--seed", "-1", ">= 0"]),
    ("--seed", "abc", ["--seed", "'abc'"]),
    ("--ctx-size", "4", ["--ctx-size", "but is 4", "from 8"]),
    ("--ctx-size", str(2**40), ["--ctx-size", str(2**40)]),
    ("--ctx-size", "1e3", ["--ctx-size", "'1e3'"]),
    ("--threads", "-1", ["--threads", "-1", "0 = all cores"]),
    ("--ubatch-size", "513", ["--ubatch-size", "513", "from 0 to 512"]),
    ("-ub", "-1", ["--ubatch-size", "-1"]),
    ("--threads", "100000", ["--threads", "100000"]),
    ("--n-gpu-layers", "-2", ["--n-gpu-layers", "-2", ">= -1"]),
    ("-ngld", "-5", ["--draft-n-gpu-layers", "-5"]),
    ("--max-tokens", "0", ["--max-tokens", "but is 0", ">= 1"]),
    ("-n", "many", ["--max-tokens", "'many'"]),
    ("--rpc-timeout", "-1", ["--rpc-timeout", "-1", ">= 0"]),
    ("--rpc", "nohost", ["--rpc", "nohost", "HOST:PORT"]),
    ("--draft-rpc", "h:0", ["--draft-rpc", "h:0", "1 to 65535"]),
    ("--tensor-split", "a,b", ["--tensor-split", "a,b"]),
    ("--no-such-option", "1", ["no such option", "--no-such-option"]),
]


def shared_rows():
    for command in SAMPLING_COMMANDS:
        for option, value, fragments in SHARED_OPTIONS:
            yield pytest.param([command, option, value], fragments, id=f"{command} {option} {value}")


# Command lines with {tiny} (the tiny target), {dir}, {missing}, {binary}, {empty}, {cut},
# {noarch}, {vocab_only}, {alien}, {minimum}, {schema_prompts}, {prompts}, {mtp_only}, {mamba} and
# {qwen35} filled in by the `inputs` fixture.
COMMAND_ROWS = [
    # prompts
    (["generate", "", "-m", "{tiny}", "--lookup"], ["no prompt", "PROMPT is empty"]),
    (["generate", " \n ", "-m", "{tiny}", "--lookup"], ["no prompt", "PROMPT is empty"]),
    (["generate", "hi\udcff", "-m", "{tiny}", "--lookup"], ["PROMPT is not UTF-8"]),
    (["generate", "-f", "{empty}", "-m", "{tiny}"], ["no prompt", "--prompt-file", "is empty"]),
    (["generate", "-f", "{binary}", "-m", "{tiny}"], ["--prompt-file", "not UTF-8", "line 2"]),
    (["generate", "-f", "{missing}", "-m", "{tiny}"], ["--prompt-file", "missing.txt", "No such file"]),
    (["generate", "-f", "{dir}", "-m", "{tiny}"], ["--prompt-file", "Is a directory"]),
    (["generate", "hi", "-f", "{empty}"], ["either as an argument or with --prompt-file"]),
    (["generate", "hi", "--k", "0"], ["--k", "'0'", "'auto'"]),
    (["generate", "hi", "--k", "fast"], ["--k", "'fast'"]),
    (["generate", "hi", "extra"], ["unexpected extra argument", "extra"]),
    # chat
    # drafts: any vocabulary drafts, translated, but not what is no model or shares almost nothing
    (["generate", "hi", "-m", "{tiny}", "--draft", "{binary}"], ["binary.txt is not a GGUF file"]),
    (
        ["generate", "hi", "-m", "{tiny}", "--draft", "{vocab_only}"],
        ["draft model", "tokenizer.gguf holds no weights", "vocab-only"],
    ),
    (["generate", "hi", "-m", "{tiny}", "--draft", "{noarch}"], ["draft model", "noarch.gguf holds no weights"]),
    (
        ["generate", "hi", "-m", "{tiny}", "--draft", "{alien}"],
        ["alien.gguf shares almost no tokens with target", "0 of its 400"],
    ),
    (
        ["generate", "hi", "-m", "{tiny}", "--draft", "mtp"],
        ["target model", "has no MTP (NextN) layers, so it cannot draft for itself"],
    ),
    (
        ["generate", "hi", "-m", "{tiny}", "--draft", "{mtp_only}"],
        ["draft model mtp-qwen35.gguf is an MTP drafter", "specrun cannot run yet"],
    ),
    # targets with a recurrent state, and their own MTP heads
    (["generate", "hi", "-m", "{mamba}", "--lookup"], ["(mamba) keeps a recurrent state that llama.cpp cannot roll back"]),
    (
        ["generate", "hi", "-m", "{qwen35}", "--lookup", "--k", "8", "--ubatch-size", "6"],
        ["can roll back only 4 tokens with --ubatch-size 6"],
    ),
    (["generate", "hi", "-m", "{tiny}", "-l", "7+1", "-l", "99999-inf"], ["--logit-bias", "target's token ids", "but is 99999"]),
    # several streams
    (
        ["generate", "--batch", "{prompts}", "-m", "{tiny}", "--parallel", "0"],
        ["--parallel has to be an integer from 1 to 256, but is 0"],
    ),
    (
        ["generate", "--batch", "{prompts}", "-m", "{tiny}", "--parallel", "4", "-c", "128"],
        ["--parallel 4 gives each stream 128 tokens of context", "raise --ctx-size"],
    ),
    (["bench", "--parallel", "2", "-c", "64", "-m", "{tiny}"], ["--parallel 2 gives each stream 64 tokens of context"]),
    # structured output
    (["generate", "hi", "-m", "{tiny}", "--json-schema", "{empty}"], ["--json-schema", "empty.txt", "not JSON"]),
    (
        ["generate", "hi", "-m", "{tiny}", "--json-schema", "{minimum}"],
        ["--json-schema", "unsupported JSON schema feature 'minimum'"],
    ),
    (
        ["generate", "hi", "-m", "{tiny}", "--json-schema", "{minimum}", "--grammar", "{empty}"],
        ["either --json-schema or --grammar"],
    ),
    (["generate", "hi", "-m", "{tiny}", "--grammar", "{empty}"], ["the grammar has no `root ::= ...` rule"]),
    (["bench", "{schema_prompts}", "-m", "{tiny}"], ["prompts.jsonl line 1", '"schema"', "'not'"]),
    (["chat", "-m", "{tiny}", "--k", "-2"], ["--k", "'-2'"]),
    (["chat", "-m", "{tiny}", "--chat-format", "nope"], ["--chat-format", "'nope'", "chatml"]),
    (["chat", "-m", "{tiny}", "-n", "3000"], ["--max-tokens", "at most half the context (2048 tokens", "but is 3000"]),
    # serve
    (["serve", "-m", "{tiny}", "--port", "70000"], ["--port", "70000", "0 to 65535"]),
    (["serve", "-m", "{tiny}", "--queue", "0"], ["--queue", "but is 0"]),
    (["serve", "-m", "{tiny}", "--parallel", "0"], ["--parallel has to be an integer from 1 to 256, but is 0"]),
    (["serve", "-m", "{tiny}", "--parallel", "2", "-c", "100"], ["--parallel 2 gives each stream 100 tokens of context"]),
    (["serve", "-m", "{tiny}", "--store-tokens", "-1"], ["--store-tokens", "-1"]),
    (["serve", "-m", "{tiny}", "--api-key", " "], ["--api-key is empty"]),
    (["serve", "-m", "{tiny}", "--chat-format", "nope"], ["--chat-format", "'nope'"]),
    (["serve", "-m", "{tiny}", "--cors-origin", "localhost:3000"], ["--cors-origin", "'localhost:3000'", "scheme://host"]),
    (["serve", "-m", "{tiny}", "--cors-origin", "http://example.com/app"], ["--cors-origin", "not an origin"]),
    # bench
    (["bench", "{missing}", "-m", "{tiny}"], ["prompts file not found", "missing.txt"]),
    (["bench", "{binary}", "-m", "{tiny}"], ["binary.txt line 2", "not UTF-8"]),
    (["bench", "{empty}", "-m", "{tiny}"], ["empty.txt holds no prompts"]),
    (["bench", "--set", "poems", "-m", "{tiny}"], ["--set", "'poems'", "code"]),
    (["bench", "--methods", "plain,magic", "-m", "{tiny}"], ["--methods", "'magic'"]),
    (["bench", "--k", "2,0", "-m", "{tiny}"], ["--k", "'0'"]),
    (["bench", "--k", ",", "-m", "{tiny}"], ["--k is empty"]),
    (["bench", "--repeat", "0", "-m", "{tiny}"], ["--repeat", "but is 0"]),
    (["bench", "--warmup", "-1", "-m", "{tiny}"], ["--warmup", "-1"]),
    (["bench", "--json", "{missing_dir}/r.json", "-m", "{tiny}"], ["--json", "does not exist"]),
    (["bench", "--csv", "{dir}", "-m", "{tiny}"], ["--csv", "is a directory"]),
    (["bench", "--plot", "{dir}/chart.xyz", "-m", "{tiny}"], ["--plot", "unknown image type"]),
    # pair check
    (["pair", "check", "{missing}", "{tiny}"], ["no such model file", "missing.txt"]),
    (["pair", "check", "{cut}", "{tiny}"], ["cut.gguf", "not a readable GGUF file"]),
    (["pair", "check", "{dir}", "{tiny}"], ["is a directory"]),
    (["pair", "check", "{tiny}", "{tiny}", "--ctx", "0"], ["--ctx", "but is 0"]),
    (["pair", "check", "{tiny}", "{tiny}", "--acceptance", "2"], ["--acceptance", "[0, 1]", "but is 2"]),
    (["pair", "check", "{tiny}"], ["missing argument", "draft"]),
    (["pair", "check", "{tiny}", "{tiny}", "--k", "0"], ["--k", "'0'"]),
    (["pair", "check", "{tiny}", "mtp"], ["has no MTP (NextN) layers, so it cannot draft for itself", "pair suggest --target"]),
    # pair derive
    (["pair", "derive", "-m", "{tiny}", "-o", "{missing_dir}/d.gguf", "--layers", "0"], ["--output", "does not exist"]),
    (["pair", "derive", "-m", "{tiny}", "-o", "{dir}", "--layers", "0"], ["--output", "is a directory"]),
    (["pair", "derive", "-m", "{noarch}", "-o", "{dir}/d.gguf", "--layers", "0"], ["noarch.gguf", "general.architecture"]),
    (["pair", "derive", "-m", "{tiny}", "-o", "{dir}/d.gguf", "--layers", "0-x"], ["--layers", "'0-x'"]),
    (["pair", "derive", "-m", "{tiny}", "-o", "{dir}/d.gguf", "--layers", "0-5"], ["--layers", "layers 0-1"]),
    (["pair", "derive", "-m", "{tiny}", "-o", "{dir}/d.gguf", "--layers", "0", "-t", "-1"], ["--threads", "-1"]),
    (["pair", "derive", "-m", "{missing}", "-o", "{dir}/d.gguf", "--layers", "0"], ["missing.txt"]),
    # pair suggest, pull, models, doctor
    (["pair", "suggest", "-m", "{tiny}", "--top", "0"], ["--top", "but is 0"]),
    (["pull"], ["missing argument"]),
    (["doctor", "--yaml"], ["no such option", "--yaml"]),
]


@pytest.fixture(scope="module")
def recurrent(tmp_path_factory):
    """Tiny GGUFs of targets with a recurrent state: a Mamba llama.cpp cannot roll back and a
    qwen35 it rolls back."""
    root = tmp_path_factory.mktemp("recurrent")
    return {
        "mamba": str(write_tiny_mamba(root / "mamba.gguf")),
        "qwen35": str(write_tiny_qwen35(root / "qwen35.gguf")),
    }


@pytest.fixture
def inputs(tmp_path, tiny, recurrent, monkeypatch, record_property):
    """Bad inputs in a folder; the test runs there and checks nothing new appears.

    Each refusal's line is recorded for the report (`pytest --junitxml`, docs/errors.md)."""
    folder = tmp_path / "work"
    (folder / "dir").mkdir(parents=True)
    (folder / "binary.txt").write_bytes(b"fine\nbroken \xff\xfe here\n")
    (folder / "empty.txt").write_text("")
    (folder / "cut.gguf").write_bytes(Path(tiny["target"]).read_bytes()[:200])  # inside the header
    # A GGUF whose header holds one key and no general.architecture.
    (folder / "noarch.gguf").write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"name" + struct.pack("<IQ", 8, 1) + b"x"
    )
    write_tiny_llama(folder / "tokenizer.gguf", vocab="gpt2", vocab_only=True)
    (folder / "minimum.json").write_text('{"type": "integer", "minimum": 3}')
    (folder / "prompts.txt").write_text("the cat\nthe dog\n")
    (folder / "prompts.jsonl").write_text('{"prompt": "x", "schema": {"not": {"type": "null"}}}\n')
    # Config and caches live beside the folder: matplotlib keeps its font list there.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(folder)
    return {
        "tiny": str(tiny["target"]),
        "dir": str(folder / "dir"),
        "missing": str(folder / "missing.txt"),
        "missing_dir": str(folder / "no" / "such"),
        "binary": str(folder / "binary.txt"),
        "empty": str(folder / "empty.txt"),
        "cut": str(folder / "cut.gguf"),
        "noarch": str(folder / "noarch.gguf"),
        "vocab_only": str(folder / "tokenizer.gguf"),
        "alien": str(tiny["alien"]),
        "minimum": str(folder / "minimum.json"),
        "schema_prompts": str(folder / "prompts.jsonl"),
        "prompts": str(folder / "prompts.txt"),
        **recurrent,
        "mtp_only": str(write_tiny_qwen35(tmp_path / "mtp-qwen35.gguf", mtp_only=True)),
        "root": folder,
        "record": record_property,
    }


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")}


def assert_refused(argv, fragments, inputs, capsys, monkeypatch, stdin=None):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((stdin or "").encode())))
    before = tree(inputs["root"])
    code = run_app([arg.format(**inputs) for arg in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert out == ""
    assert tree(inputs["root"]) == before  # nothing written, not even a partial file
    shown = " ".join(arg if arg.isprintable() and arg.strip() else repr(arg) for arg in argv)
    inputs["record"]("input", shown + ("" if stdin is None else f" with {stdin!r} on standard input"))
    inputs["record"]("refusal", lines[0])


@pytest.mark.parametrize("argv, fragments", list(shared_rows()))
def test_shared_options_refuse_bad_values(argv, fragments, inputs, capsys, monkeypatch):
    prompt = ["hi"] if argv[0] == "generate" else []
    assert_refused(
        [*argv[:1], *prompt, "-m", "{tiny}", "--lookup", *argv[1:]] if argv[0] != "bench" else [*argv, "-m", "{tiny}"],
        fragments,
        inputs,
        capsys,
        monkeypatch,
    )


@pytest.mark.parametrize("argv, fragments", COMMAND_ROWS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_commands_refuse_bad_input(argv, fragments, inputs, capsys, monkeypatch):
    assert_refused(argv, fragments, inputs, capsys, monkeypatch)


@pytest.mark.parametrize("argv", [["models", "--aliases"], ["generate", "hi", "-m", "llama-1b"]])
def test_a_profile_that_is_not_utf8_is_one_line(argv, inputs, tmp_path, capsys, monkeypatch):
    profiles = tmp_path / "config" / "specrun" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "mine.yaml").write_bytes(b"family: caf\xe9\n")
    assert_refused(argv, ["profile", "mine.yaml line 1", "not UTF-8"], inputs, capsys, monkeypatch)


@pytest.mark.parametrize("stdin, fragment", [("", "standard input is empty"), ("  \n", "standard input is empty")])
def test_an_empty_prompt_on_stdin_is_refused(stdin, fragment, inputs, capsys, monkeypatch):
    assert_refused(["generate", "-m", "{tiny}", "--lookup"], [fragment], inputs, capsys, monkeypatch, stdin=stdin)


def specrun(*args, stdin: bytes = b"", env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "specrun", *map(str, args)],
        input=stdin,
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def assert_one_line(result, *fragments):
    err = result.stderr.decode()
    assert result.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("locale", ["C.UTF-8", "C"])
def test_bytes_that_are_not_utf8_on_stdin(tiny, locale):
    """Under the C locale Python reads stdin with surrogateescape: the bytes must still be refused."""
    result = specrun(
        "generate", "-m", tiny["target"], "--lookup", stdin=b"the cat \xff\xfe sat", env={"LC_ALL": locale, "PYTHONUTF8": "0"}
    )
    assert_one_line(result, "standard input", "not UTF-8")


def test_chat_save_onto_a_directory_is_one_line_and_nothing_is_left(tiny, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    result = specrun(
        "chat", "-m", tiny["target"], "-n", 4, "--ctx-size", 256, "--threads", 1, stdin=f"the cat\n/save {folder}\n".encode()
    )
    err = result.stderr.decode()
    assert result.returncode == 2 and err.strip().splitlines()[-1] == f"error: /save {folder} is a directory: give a file name"
    assert list(folder.iterdir()) == [] and list(tmp_path.iterdir()) == [folder]


@pytest.mark.parametrize(
    "module, fragments",
    [
        ('raise ImportError("libllama.so: cannot open shared object file")', ["not importable", "libllama.so", "pip install"]),
        ('__version__ = "0.2.90"', ["0.2.90 is older than specrun needs", "pip install"]),
    ],
)
def test_a_missing_or_old_llama_cpp_python_is_one_line(tmp_path, module, fragments):
    fake = tmp_path / "llama_cpp"
    fake.mkdir()
    (fake / "__init__.py").write_text(module)
    result = specrun("generate", "hi", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert_one_line(result, *fragments)
