"""What translating costs a draft with another vocabulary, at a short and a long context (benchmark, not CI).

For each context length, a greedy generation drafts with SmolLM2-135M for Gemma 3 270M (or
any pair) at a fixed k, and the run's counters give, per drafted token, the time spent
translating (re-encoding the accepted text for the draft's cache, tokenizing its guess for
the target) against the draft's own decode time. The baseline is what llama.cpp's removed
code did each step: the whole history detokenized and tokenized again with the draft's
tokenizer, timed on the same history.

    python scripts/translate_costs.py --draft ~/.cache/specrun-ci/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specrun.config import SessionConfig  # noqa: E402
from specrun.hub.embedded import embedded_model_path  # noqa: E402
from specrun.session import Session  # noqa: E402

PARAGRAPH = (
    "The history of the city begins with a small settlement on the river, where traders met to exchange grain, "
    "salt and cloth. Over the centuries the market grew into a town, the town into a port, and the port into "
    "the capital of a province whose roads reached the mountains in the north and the sea in the south. "
)


def history_of(session: Session, tokens: int) -> list[int]:
    """A prompt of about `tokens` target tokens."""
    text = PARAGRAPH
    while len(session.tokenize(text)) < tokens:
        text += PARAGRAPH
    return session.tokenize(text)[:tokens]


def whole_history_s(session: Session, history: list[int], repeats: int = 20) -> float:
    """Seconds to detokenize the whole history and tokenize it with the draft, as one step of
    llama.cpp's removed translation did (median of `repeats`). Each is timed right after a draft
    decode, as in the loop, where llama.cpp's threads are still spinning on the cores."""
    context = session.drafter.context
    draft = context.model
    times = []
    for _ in range(repeats):
        context.eval([context.tokens[-1]])
        context.truncate(len(context.tokens) - 1)
        started = time.perf_counter()
        draft.tokenize(session.target_model.render(history), add_special=False, parse_special=True)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--draft", type=Path, required=True, help="draft GGUF with another vocabulary")
    parser.add_argument("--contexts", default="100,2000", help="prompt lengths in target tokens")
    parser.add_argument("--tokens", type=int, default=96, help="tokens generated per run")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--translation", default="text", choices=("text", "tokens"))
    args = parser.parse_args()
    config = SessionConfig(
        target=args.target or embedded_model_path(),
        draft=args.draft,
        k=args.k,
        n_ctx=4096,
        threads=args.threads,
        translation=args.translation,
    )
    print(
        f"{'context':>8} {'drafted':>8} {'translate/token':>16} {'draft decode/token':>19} {'share':>6} "
        f"{'per step':>10} {'whole history':>14} {'x cheaper':>10}"
    )
    with Session(config) as session:
        for length in (int(n) for n in args.contexts.split(",")):
            history = history_of(session, length)
            session.engine().run(history, 4)  # the draft's cache takes the prompt: its prefill is not timed below
            stats = session.engine().run(history, args.tokens).stats
            translate = stats.translate_s / stats.drafted
            decode = (stats.draft_s - stats.translate_s) / stats.drafted
            per_step = stats.translate_s / stats.steps
            baseline = whole_history_s(session, history)
            print(
                f"{length:8} {stats.drafted:8} {1e6 * translate:13.0f} us {1e3 * decode:16.2f} ms {translate / decode:6.1%} "
                f"{1e6 * per_step:7.0f} us {1e6 * baseline:11.0f} us {baseline / per_step:9.1f}x"
            )


if __name__ == "__main__":
    main()
