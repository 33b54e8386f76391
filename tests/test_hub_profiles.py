"""Profiles as data: the built-in families, validation errors, user overrides; spec and quant parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from specrun.errors import SpecrunError
from specrun.hub.choice import fit_quant
from specrun.hub.memory import MemoryBudget, parse_meminfo_available, run_bytes
from specrun.hub.profiles import builtin_profiles_dir, load_profiles
from specrun.hub.quants import QuantChoice, RepoFile, group_quants, quant_of
from specrun.hub.spec import parse_spec

GOOD = """\
family: tiny
default_k: 4
models:
  tiny-1b:
    repo: someone/Tiny-1B-GGUF
    file: Tiny-1B-{quant}.gguf
    params: 1.1B
  tiny-8b:
    repo: someone/Tiny-8B-GGUF
    file: Tiny-8B-{quant}.gguf
    params: 8B
    drafts: [tiny-1b]
    k: 10
"""


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def test_builtin_profiles_cover_the_families_with_valid_drafts():
    profiles = load_profiles([builtin_profiles_dir()])
    families = {p.family for p in profiles.values()}
    assert {
        "llama",
        "qwen2.5",
        "qwen2.5-coder",
        "qwen3",
        "gemma3",
        "qwen3.5",
        "qwen3.6",
        "gemma4",
        "glm-4.5",
        "glm-4.7-flash",
        "nemotron-h",
        "lfm2",
        "gpt-oss",
    } <= families
    for alias in (
        "llama-1b",
        "llama-70b",
        "qwen2.5-0.5b",
        "qwen2.5-72b",
        "qwen2.5-coder-32b",
        "qwen3-8b",
        "gemma-3-270m",
        "gemma-3-27b",
        "qwen3.5-0.8b",
        "qwen3.5-122b-a10b",
        "qwen3.6-27b",
        "gemma-4-31b",
        "glm-4.5-air",
        "nemotron-nano-9b-v2",
        "lfm2-8b-a1b",
        "gpt-oss-120b",
    ):
        assert alias in profiles
    assert profiles["llama-70b"].drafts[0] == "llama-1b" and profiles["llama-70b"].k == 12
    for profile in profiles.values():
        for draft in profile.drafts:  # a draft shares the target's tokenizer and reads fewer parameters a token
            assert profiles[draft].tokenizer == profile.tokenizer
            assert profiles[draft].active_params < profile.active_params


def test_builtin_profiles_say_what_each_model_is():
    profiles = load_profiles([builtin_profiles_dir()])
    qwen = profiles["qwen3.5-35b-a3b"]
    assert (qwen.mtp, qwen.hybrid, qwen.params, qwen.active_params) == ("heads", True, 35_000_000_000, 3_000_000_000)
    assert profiles["gemma-4-31b"].mtp == "separate" and not profiles["gemma-4-31b"].hybrid
    assert profiles["glm-4.7"].mtp == "heads" and profiles["lfm2-1.2b"].hybrid and not profiles["lfm2-1.2b"].mtp
    llama = profiles["llama-8b"]
    assert (llama.mtp, llama.hybrid, llama.active_params) == ("", False, llama.params)
    assert profiles["qwen3.6-27b"].tokenizer == profiles["qwen3.5-0.8b"].tokenizer  # its drafts come from Qwen3.5
    assert profiles["qwen3.6-27b"].drafts[0] == "qwen3.6-27b-dflash" and profiles["qwen3.6-27b-dflash"].drafter == "dflash"
    assert not profiles["qwen3.6-27b"].drafter


def test_user_profiles_add_and_override(tmp_path):
    user = tmp_path / "user"
    write(user, "tiny.yaml", GOOD)
    write(
        user,
        "mine.yaml",
        GOOD.replace("family: tiny", "family: mine").replace("tiny-1b", "llama-1b").replace("tiny-8b", "mine-8b"),
    )
    profiles = load_profiles([builtin_profiles_dir(), user])
    assert profiles["tiny-8b"].k == 10 and profiles["tiny-8b"].drafts == ("tiny-1b",)
    assert profiles["tiny-1b"].params == 1_100_000_000 and profiles["tiny-1b"].k == 4
    assert (profiles["tiny-1b"].mtp, profiles["tiny-1b"].hybrid) == ("", False)  # neither unless a file says so
    assert profiles["llama-1b"].repo == "someone/Tiny-1B-GGUF"  # the user's wins
    assert profiles["llama-8b"].repo.startswith("bartowski/")  # the rest stay


def test_user_profiles_live_in_the_xdg_config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    write(tmp_path / "specrun" / "profiles", "tiny.yaml", GOOD)
    assert "tiny-8b" in load_profiles()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD.replace("    params: 8B\n", "    params: 8B\n    colour: red\n"),
            r"tiny.yaml:12: models.tiny-8b.colour: unknown field",
        ),
        (GOOD.replace("someone/Tiny-8B-GGUF", "not-a-repo"), r"tiny.yaml:9: models.tiny-8b.repo: must look like owner/name"),
        (GOOD.replace("Tiny-1B-{quant}.gguf", "Tiny-1B.gguf"), r"tiny.yaml:6: models.tiny-1b.file: must contain \{quant\}"),
        (GOOD.replace("    params: 1.1B\n", ""), r"tiny.yaml:5: models.tiny-1b.params: missing"),
        (GOOD.replace("params: 8B", "params: lots"), r"tiny.yaml:11: models.tiny-8b.params: must be a count"),
        (GOOD.replace("k: 10", "k: 0"), r"tiny.yaml:13: models.tiny-8b.k: must be an integer from 1 to 64"),
        (GOOD.replace("default_k: 4", "default_k: four"), r"tiny.yaml:2: default_k: must be an integer"),
        (GOOD.replace("drafts: [tiny-1b]", "drafts: [tiny-0b]"), r"models.tiny-8b.drafts: unknown alias 'tiny-0b'"),
        (
            GOOD.replace("    k: 10\n", "    k: 10\n    mtp: maybe\n"),
            r"tiny.yaml:14: models.tiny-8b.mtp: must be true, false or separate, got 'maybe'",
        ),
        (
            GOOD.replace("    k: 10\n", "    k: 10\n    hybrid: 1\n"),
            r"tiny.yaml:14: models.tiny-8b.hybrid: must be true or false, got 1",
        ),
        (
            GOOD.replace("    k: 10\n", "    k: 10\n    drafter: medusa\n"),
            r"tiny.yaml:14: models.tiny-8b.drafter: must be one of eagle3, dflash, dspark, got 'medusa'",
        ),
        (
            GOOD.replace("params: 8B", "params: 8B\n    active: 9B"),
            r"tiny.yaml:12: models.tiny-8b.active: must be at most params \(8B\), got '9B'",
        ),
        (GOOD.replace("params: 8B", "params: 8B\n    active: few"), r"tiny.yaml:12: models.tiny-8b.active: must be a count"),
        (GOOD + "  tiny-1b:\n    repo: a/b\n", r"tiny.yaml:14: tiny-1b: duplicate key"),
        (GOOD.replace("models:\n", "models: [\n"), r"tiny.yaml:\d+: not valid YAML"),
        ("- just\n- a list\n", r"tiny.yaml:1: \(top level\): must be a mapping"),
    ],
)
def test_bad_profiles_name_file_line_and_field(tmp_path, text, expected):
    write(tmp_path, "tiny.yaml", text)
    with pytest.raises(SpecrunError, match=expected):
        load_profiles([tmp_path])


def test_mtp_hybrid_and_active_parameters_are_read(tmp_path):
    text = GOOD.replace("params: 8B", "params: 8B\n    active: 1B\n    mtp: true\n    hybrid: true").replace(
        "params: 1.1B", "params: 1.1B\n    mtp: separate\n    hybrid: false"
    )
    write(tmp_path, "tiny.yaml", text)
    profiles = load_profiles([tmp_path])
    big, small = profiles["tiny-8b"], profiles["tiny-1b"]
    assert (big.mtp, big.hybrid, big.params, big.active_params) == ("heads", True, 8_000_000_000, 1_000_000_000)
    assert (small.mtp, small.hybrid, small.active_params) == ("separate", False, 1_100_000_000)


def test_an_alias_defined_twice_in_one_layer_is_refused(tmp_path):
    write(tmp_path, "a.yaml", GOOD)
    write(tmp_path, "b.yaml", GOOD.replace("family: tiny", "family: other"))
    with pytest.raises(SpecrunError, match="alias 'tiny-1b' is defined twice"):
        load_profiles([tmp_path])


def test_spec_forms():
    aliases = {"llama-8b", "qwen2.5-0.5b"}
    assert parse_spec("LLAMA-8B:q4_k_m", aliases).alias == "llama-8b"
    assert parse_spec("llama-8b:q4_k_m", aliases).quant == "Q4_K_M"
    assert parse_spec("qwen2.5-0.5b", aliases).quant is None
    repo = parse_spec("bartowski/Some-GGUF:IQ4_XS", aliases)
    assert (repo.repo, repo.quant, repo.filename) == ("bartowski/Some-GGUF", "IQ4_XS", None)
    named = parse_spec("bartowski/Some-GGUF/sub/Some-Q8_0-00001-of-00002.gguf", aliases)
    assert (named.repo, named.filename) == ("bartowski/Some-GGUF", "sub/Some-Q8_0-00001-of-00002.gguf")
    with pytest.raises(SpecrunError, match="'Q9_Z' is not a GGUF quant name"):
        parse_spec("llama-8b:Q9_Z", aliases)
    with pytest.raises(SpecrunError, match="did you mean llama-8b"):
        parse_spec("llama8b", aliases)


def test_quant_names_and_split_sets():
    assert quant_of("Qwen3-8B-UD-Q4_K_XL.gguf") == "Q4_K_XL"
    assert quant_of("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf") == "Q4_K_M"
    assert quant_of("Qwen3-4B-bf16.gguf") == "BF16" and quant_of("model.gguf") is None
    files = [
        RepoFile("m-Q8_0-00001-of-00002.gguf", 5),
        RepoFile("m-Q4_K_M.gguf", 3),
        RepoFile("mmproj-m-f16.gguf", 2),
        RepoFile("m-Q6_K-00001-of-00002.gguf", 4),
    ]
    choices = group_quants(files)
    assert set(choices) == {"Q4_K_M"}  # the split sets lack part 2; mmproj is not a model
    files.append(RepoFile("m-Q8_0-00002-of-00002.gguf", 5))
    assert group_quants(files)["Q8_0"].size == 10


def choice(quant: str, size: int) -> QuantChoice:
    return QuantChoice(quant, (RepoFile(f"m-{quant}.gguf", size),))


def test_fit_quant_rules():
    choices = {q: choice(q, s) for q, s in [("Q4_K_M", 4_000), ("Q8_0", 8_000), ("F32", 30_000)]}
    budget = MemoryBudget(run_bytes(30_000), "RAM")
    assert fit_quant("m", choices, budget, 0).quant_choice.quant == "Q8_0"  # F32 never automatic
    tight = fit_quant("m", choices, MemoryBudget(1000, "RAM"), 0)
    assert tight.quant_choice.quant == "Q4_K_M" and "none fits" in tight.reason
    unknown = fit_quant("m", choices, None, 0)
    assert unknown.quant_choice.quant == "Q4_K_M" and "unknown" in unknown.reason


def test_memory_readers():
    assert parse_meminfo_available("MemTotal: 100 kB\nMemAvailable:    2048 kB\n") == 2048 * 1024
