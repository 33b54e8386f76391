"""Time to first token per chat turn, with the KV caches kept across turns and without.

    PYTHONPATH=. python3 scripts/chat_ttft.py [--target GGUF] [--turns 10] [--max-tokens 48] [--threads 2]

With reuse, each turn prefills only its new text, so TTFT stays flat as the history
grows; the last line re-runs the final turn on emptied caches to show what re-reading
the whole history would cost.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specrun.chat.formats import choose_format
from specrun.chat.runner import ChatRunner
from specrun.config import SessionConfig
from specrun.hub.embedded import embedded_model_path
from specrun.session import Session

# A long first message, so the history is a few hundred tokens before the later turns.
CONTEXT = (
    "Here are my notes on Lyon. Lyon is a city in France, at the meeting of the Rhone and the Saone. "
    "It was founded by the Romans in 43 BC as Lugdunum and became the capital of the Gauls. "
    "In the Renaissance it was a centre of banking and printing, and later of silk weaving; the "
    "traboules, covered passages through the buildings of the old town, let silk workers carry "
    "their cloth dry through the rain. The old town, Vieux Lyon, is one of the largest Renaissance "
    "quarters in Europe and is a UNESCO World Heritage Site together with the Fourviere hill and "
    "the Croix-Rousse. The Lumiere brothers made some of the first films there in 1895. "
    "Lyon is known for its food: the bouchons serve quenelles, saucisson, salade lyonnaise and "
    "tarte aux pralines, and the chef Paul Bocuse worked nearby. Beaujolais and Cotes du Rhone "
    "wines come from the hills around it. The Festival of Lights takes place every December, when "
    "people put candles in their windows. "
)
MESSAGES = [
    CONTEXT + "Tell me about the city of Lyon.",
    "What is it famous for?",
    "And its food?",
    "Name a famous dish.",
    "How is it cooked?",
    "What wine goes with it?",
    "Where is that wine made?",
    "Is the region old?",
    "Who founded it?",
    "Summarize what we discussed.",
    "Anything else?",
    "Thanks, goodbye.",
]


class Quiet:
    def show(self, pieces) -> None:
        pass

    def step(self, event, stats) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    config = SessionConfig(target=args.target or embedded_model_path(), lookup=True, threads=args.threads)
    with Session(config) as session:
        runner = ChatRunner(session, choose_format(session.target_model, None), args.max_tokens)
        print("turn  prompt_tokens  prefilled  ttft_ms")
        for i in range(args.turns):
            message = MESSAGES[i % len(MESSAGES)]
            started = time.perf_counter()
            turn = runner.prepare(message)
            reply = runner.reply(turn, Quiet(), started)
            s = reply.stats
            print(f"{i + 1:4}  {s.prompt_tokens:13}  {s.prefilled_tokens:9}  {1000 * reply.ttft_s:7.1f}")
        # The same last turn again, on emptied caches: the whole history is prefilled.
        last = runner.conversation.tokens
        session.target.truncate(0)
        generator = session.engine(plain=True)
        started = time.perf_counter()
        generator.run(last, 1)
        ttft = time.perf_counter() - started
        print(f"cold  {len(last):13}  {generator.stats.prefilled_tokens:9}  {1000 * ttft:7.1f}  (whole history re-read)")


if __name__ == "__main__":
    main()
