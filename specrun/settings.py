"""What each setting may be, checked in one place.

The library checks every setting it takes against `RULES` and raises a `SettingError`
that names the parameter as the library spells it (`temperature`, `n_ctx`). The front
ends only translate the name: the CLI into its option (`--temp`, `--ctx-size`), the
server into OpenAI's error object for the request field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from specrun.errors import SpecrunError

INT32_MAX = 2**31 - 1  # llama.cpp's context fields are 32-bit: larger values would wrap silently
MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS
BATCH = 512  # rows in the widest decode a session makes; verify batches and micro-batches fit in it


class SettingError(SpecrunError):
    """A setting outside what it may be; `param` is its library name, `allowed` says what it may be."""

    def __init__(self, param: str, allowed: str, value: Any):
        self.param, self.allowed, self.value = param, allowed, value
        super().__init__(self.phrase(param))

    def phrase(self, name: str) -> str:
        """The message with the setting called `name` (a CLI option, a request field)."""
        return f"{name} has to be {self.allowed}, but is {shown(self.value)}"


def shown(value: Any) -> str:
    """The value as the message quotes it: strings in quotes, a number as short as it reads."""
    if isinstance(value, str):
        text = repr(value)
    else:
        text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


@dataclass(frozen=True)
class Rule:
    """A number in [low, high] ((low, high] when `low_open`), finite, an integer if `integer`."""

    allowed: str  # what the message says the setting may be
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    integer: bool = False

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False  # an int is always finite, and may be too large for math.isfinite
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return above and (self.high is None or value <= self.high)


def _count(low: int, note: str = "", high: int | None = None) -> Rule:
    span = f"from {low} to {high}" if high is not None else f">= {low}"
    return Rule(f"an integer {span}{f' ({note})' if note else ''}", low, high, integer=True)


RULES: dict[str, Rule] = {
    # sampling
    "temperature": Rule("a number >= 0 (0 is greedy)", 0),
    "top_k": _count(0, "0 disables it"),
    "top_n_sigma": Rule("a number (0 or below disables it)"),
    "typical_p": Rule("a number in [0, 1] (1 disables it)", 0, 1),
    "top_p": Rule("a number in (0, 1] (1 disables it)", 0, 1, low_open=True),
    "min_p": Rule("a number in [0, 1] (0 disables it)", 0, 1),
    "seed": _count(0, "leave it out for a random seed"),
    "repeat_penalty": Rule("a number from 0.01 to 100 (1 disables it)", 0.01, 100),
    "frequency_penalty": Rule("a number from -2 to 2 (0 disables it)", -2, 2),
    "presence_penalty": Rule("a number from -2 to 2 (0 disables it)", -2, 2),
    "repeat_last_n": _count(0, "0 disables the penalties", INT32_MAX),
    "xtc_probability": Rule("a number in [0, 1] (0 disables it)", 0, 1),
    "xtc_threshold": Rule("a number in [0, 1] (above 0.5 disables it)", 0, 1),
    "dynatemp_range": Rule("a number >= 0 (0 disables it)", 0),
    "dynatemp_exponent": Rule("a number >= 0", 0),
    "max_tokens": _count(1),
    "logprobs": _count(0, high=20),  # the likeliest tokens reported beside each emitted one (OpenAI's top_logprobs)
    # models and llama.cpp
    "n_ctx": _count(8, high=INT32_MAX),
    "threads": _count(0, "0 = all cores", MAX_THREADS),
    "n_ubatch": _count(0, f"0 = {BATCH}", BATCH),
    "n_gpu_layers": Rule("an integer >= -1 (-1 = all)", -1, INT32_MAX, integer=True),
    "draft_n_gpu_layers": Rule("an integer >= -1 (-1 = all)", -1, INT32_MAX, integer=True),
    "rpc_timeout": Rule("a number of seconds >= 0 (0 = forever)", 0),
    "store_tokens": _count(0, "0 disables the store", INT32_MAX),
    "parallel": _count(1, high=256),  # streams run at once, each in its share of the context
    # llama-server's per-request speculative settings
    "n_max": _count(1),
    "n_min": _count(0),
    "p_min": Rule("a number in [0, 1]", 0, 1),
    # bench
    "repeat": _count(1),
    "warmup": _count(0),
    # serve
    "port": _count(0, high=65535),
    "queue": _count(1, high=1_000_000),
    # pair (pair derive's --threads is `threads` above)
    "ctx": _count(1, high=INT32_MAX),  # the context the memory estimate counts
    "acceptance": Rule("a number in [0, 1]", 0, 1),  # assumed per-token acceptance rate
    "top": _count(1),  # how many drafts pair suggest lists
}


BIAS = Rule("a number from -100 to 100, or -inf to ban the token", -100, 100)


def check_logit_bias(bias: Mapping[Any, Any]) -> None:
    """Raise a SettingError for the first entry of a logit bias that is not a token id (an integer
    >= 0) mapped to a bias BIAS allows, or -inf (a ban)."""
    for token, value in bias.items():
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise SettingError("logit_bias", "keyed by token ids (integers >= 0)", token)
        if not (BIAS.holds(value) or value == -math.inf):
            raise SettingError("logit_bias", BIAS.allowed, value)


def check_bias_tokens(bias: Mapping[int, float], n_vocab: int) -> None:
    """Raise a SettingError for a logit bias naming a token past the model's vocabulary."""
    outside = [token for token in bias if token >= n_vocab]
    if outside:
        raise SettingError("logit_bias", f"keyed by the target's token ids, from 0 to {n_vocab - 1}", outside[0])


K_ALLOWED = "an integer >= 1, 'auto' or 'llama.cpp'"


def parse_k(value: int | str) -> int | str:
    """A k: a draft length >= 1, 'auto', or 'llama.cpp' (its draft-max/p-min rule), as a number or text."""
    if value in ("auto", "llama.cpp"):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SettingError("k", K_ALLOWED, value)
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise SettingError("k", K_ALLOWED, value)
    return k


def check(**values: Any) -> None:
    """Raise a SettingError for the first value its rule refuses; None means "not given"."""
    for name, value in values.items():
        rule = RULES[name]
        if value is not None and not rule.holds(value):
            raise SettingError(name, rule.allowed, value)
