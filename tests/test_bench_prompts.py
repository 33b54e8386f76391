"""Bench inputs: prompt files, built-in sets, --methods and --k, with file:line errors."""

import json

import pytest

from specrun.bench.methods import Variant, parse_k_values, parse_methods, plan_variants
from specrun.bench.prompts import BUILTIN_SETS, DEFAULT_SETS, Prompt, load_builtin, load_prompt_file, render
from specrun.errors import SpecrunError


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def texts(prompts):
    return [p.text for p in prompts]


def test_txt_one_prompt_per_line_skips_blank_lines(tmp_path):
    prompts = load_prompt_file(write(tmp_path, "p.txt", "first prompt\n\n  \nsecond prompt\n"))
    assert texts(prompts) == ["first prompt", "second prompt"]
    assert [p.source for p in prompts] == ["p.txt:1", "p.txt:4"]


def test_txt_blocks_between_separators_keep_inner_newlines(tmp_path):
    text = "def f():\n    return 1\n---\nline one\n\nline three\n\n---\nlast\n---\n"
    prompts = load_prompt_file(write(tmp_path, "p.txt", text))
    assert texts(prompts) == ["def f():\n    return 1", "line one\n\nline three\n", "last"]
    assert [p.source for p in prompts] == ["p.txt:1", "p.txt:4", "p.txt:9"]


def test_txt_windows_newlines_and_a_leading_separator(tmp_path):
    prompts = load_prompt_file(write(tmp_path, "p.txt", "---\r\na\r\nb\r\n---\r\nc\r\n"))
    assert texts(prompts) == ["a\nb", "c"]


@pytest.mark.parametrize(
    "name, content, fragments",
    [
        ("p.txt", "a\n---\n\n---\nb\n", ["p.txt line 4", "no prompt between", "line 2"]),
        ("p.txt", b"fine\n\xff\xfe broken\n", ["p.txt line 2", "not UTF-8"]),
        ("p.txt", "\n\n", ["holds no prompts"]),
        ("p.csv", "a,b\n", ["has to end in .txt", ".jsonl"]),
        ("p.jsonl", '{"prompt": "ok"}\n{"prompt": "missing brace"\n', ["p.jsonl line 2", "not valid JSON"]),
        ("p.jsonl", '{"text": "x"}\n', ["p.jsonl line 1", '"prompt" or "messages"']),
        ("p.jsonl", '{"prompt": "x", "messages": []}\n', ["line 1", '"prompt" or "messages"']),
        ("p.jsonl", '\n{"prompt": 3}\n', ["p.jsonl line 2", "non-empty string"]),
        ("p.jsonl", '["prompt"]\n', ["line 1", "an object"]),
        ("p.jsonl", '{"messages": "hi"}\n', ["line 1", "non-empty list"]),
        ("p.jsonl", '{"messages": [{"role": "user"}]}\n', ["line 1", "message 1", '"content"']),
    ],
)
def test_bad_prompt_files_name_file_and_line(tmp_path, name, content, fragments):
    with pytest.raises(SpecrunError) as err:
        load_prompt_file(write(tmp_path, name, content))
    for fragment in fragments:
        assert fragment in str(err.value)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(SpecrunError, match="prompts file not found"):
        load_prompt_file(tmp_path / "nope.txt")


def test_jsonl_prompts_and_chats(tmp_path):
    lines = [
        {"prompt": "continue me"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]},
    ]
    prompts = load_prompt_file(write(tmp_path, "p.jsonl", "\n".join(map(json.dumps, lines)) + "\n\n"))
    assert prompts[0] == Prompt("continue me", source="p.jsonl:1", group="p.jsonl")
    assert prompts[1].text is None and prompts[1].messages == (("system", "Be brief."), ("user", "Hi?"))
    assert prompts[1].source == "p.jsonl:2"


def test_chats_render_through_the_chat_format():
    from specrun.chat.formats import PLAIN, ChatFormat, plain_transcript

    chat = Prompt(None, (("system", "Be brief."), ("user", "Hi?")))
    transcript = ChatFormat(PLAIN, plain_transcript, "test")
    assert render(chat, transcript) == "Be brief.\n\nUser: Hi?\nAssistant:"
    assert render(Prompt("plain text"), transcript) == "plain text"


def test_builtin_sets_hold_a_few_real_prompts_each():
    for name in BUILTIN_SETS:
        prompts = load_builtin([name])
        assert 3 <= len(prompts) <= 6, name
        assert all(p.group == name and len(p.text) > 80 for p in prompts)
        assert len(set(texts(prompts))) == len(prompts)
    assert len(load_builtin()) == sum(len(load_builtin([n])) for n in DEFAULT_SETS)  # structured only when asked for
    assert all(p.schema is not None for p in load_builtin(["structured"]))


def test_unknown_builtin_set():
    with pytest.raises(SpecrunError, match="unknown prompt set 'poems'.*code, extraction, chat, writing"):
        load_builtin(["poems"])


def test_k_values_and_methods():
    assert parse_k_values("2, 4,8,4") == [2, 4, 8]
    assert parse_methods("lookup, plain,lookup") == ["lookup", "plain"]
    assert plan_variants(["plain", "lookup", "draft"], [2, 8]) == [
        Variant("plain"),
        Variant("lookup", 2),
        Variant("lookup", 8),
        Variant("draft", 2),
        Variant("draft", 8),
    ]
    assert Variant("lookup", 8).key == "lookup_k8" and Variant("plain").key == "plain"
    assert parse_k_values("2,auto,llama.cpp") == [2, "auto", "llama.cpp"]
    assert Variant("lookup", "auto").key == "lookup_kauto" and Variant("draft", "llama.cpp").key == "draft_kllamacpp"


@pytest.mark.parametrize("text, fragment", [("2,x", "but is 'x'"), ("4,0", "but is '0'"), (" , ", "--k is empty")])
def test_bad_k_values(text, fragment):
    with pytest.raises(SpecrunError, match=fragment):
        parse_k_values(text)


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(
        SpecrunError,
        match="unknown method 'eagle' \\(known: plain, lookup, draft, hybrid, store, dflash, dspark, eagle3, mtp, suffix\\)",
    ):
        parse_methods("plain,eagle")
