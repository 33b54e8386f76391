"""One chat over a loaded session: turns, settings changed between replies, totals, saving."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

from specrun.chat.calibration import PlainRate
from specrun.chat.conversation import Conversation, Turn
from specrun.chat.formats import ChatFormat
from specrun.chat.reply import Reply, ReplyView, SessionStats, stream_reply
from specrun.core.events import Stats, StepEvent
from specrun.errors import SpecrunError
from specrun.files import check_writable, write_text_atomic
from specrun.session import Session
from specrun.settings import SettingError, check, parse_k


def check_reply_tokens(max_tokens: int, n_ctx: int) -> None:
    """A reply's budget is kept free in the context, so it may take at most half of it."""
    check(max_tokens=max_tokens)
    if max_tokens > n_ctx // 2:
        raise SettingError(
            "max_tokens", f"at most half the context ({n_ctx // 2} tokens; a larger context allows more)", max_tokens
        )


class ChatRunner:
    def __init__(
        self,
        session: Session,
        chat_format: ChatFormat,
        max_tokens: int,
        system: str | None = None,
        plain_rate: PlainRate | None = None,
    ):
        n_ctx = session.target.n_ctx
        check_reply_tokens(max_tokens, n_ctx)
        self.session = session
        self.max_tokens = max_tokens
        self.conversation = Conversation(session.target_model, chat_format, n_ctx, system)
        self.sampler = session.config.sampler  # /temp changes it from the next reply on
        # The session's policy for its k (/k picks another): what auto learns carries over between replies.
        self.policy = session.policies.policy(session.config.k) if session.drafter is not None else None
        self.totals = SessionStats()
        self.plain_rate = plain_rate
        self.replies: list[Reply] = []  # parallel to conversation.exchanges until a reset

    @property
    def speculative(self) -> bool:
        return self.policy is not None

    def prepare(self, user_text: str) -> Turn:
        """The prompt for the next reply (raises SpecrunError if even the message alone does not fit)."""
        return self.conversation.prompt(user_text, reserve=self.max_tokens)

    def reply(
        self, turn: Turn, view: ReplyView, started: float | None = None, cancelled: Callable[[], bool] = lambda: False
    ) -> Reply:
        """Stream the reply to a prepared turn and make both part of the conversation; `cancelled`
        is asked after every event and ends the reply as Ctrl-C does (its stop reason is "interrupted")."""
        started = time.perf_counter() if started is None else started
        if self.plain_rate:
            self.plain_rate.reset_step_clock()
        engine = self.session.engine(policy=self.policy, sampler=self.sampler)
        reply = stream_reply(engine, turn.tokens, self.max_tokens, turn.stops, _Tap(view, self._observe_step), started, cancelled)
        if turn.dropped:
            del self.replies[: turn.dropped]
        self.conversation.add_reply(turn, reply.tokens, reply.text)
        self.session.remember(turn.tokens + reply.tokens)  # drafts for later conversations, after a /reset
        self.replies.append(reply)
        self.totals.add(reply, turn.new_tokens)
        return reply

    def _observe_step(self, event: StepEvent, stats: Stats) -> None:
        if self.plain_rate:
            self.plain_rate.observe(event, stats)

    def set_k(self, k: str) -> None:
        """A draft length, 'auto' or 'llama.cpp', from the next reply on."""
        if not self.speculative:
            raise SpecrunError("plain decoding has no draft length: start with --draft PATH or --lookup to use /k")
        policy = self.session.policies.policy(parse_k(k))
        limit = self.session.target.n_batch - 1
        if policy.max_k > limit:
            raise SpecrunError(f"k has to be at most {limit} (the batch size minus one), but is {k}")
        self.policy = policy

    @property
    def k_label(self) -> str:
        return self.policy.label if self.policy is not None else "plain"

    def set_temperature(self, temperature: float) -> None:
        self.sampler = dataclasses.replace(self.sampler, temperature=temperature)  # SamplerSettings checks it

    def reset(self) -> None:
        """Forget the conversation (the caches are reused as far as the next prompt matches)."""
        self.conversation.reset()
        self.replies.clear()

    def save(self, path: Path) -> None:
        """Write the transcript with stats atomically: JSON for *.json, Markdown otherwise."""
        text = json.dumps(self.transcript(), indent=2) if path.suffix == ".json" else self._markdown()
        path = path.expanduser()
        check_writable(path, "/save")
        write_text_atomic(path, text, "/save")

    def transcript(self) -> dict:
        turns = []
        for (user, assistant), reply in zip(self.conversation.exchanges, self.replies):
            turns.append(
                {
                    "user": user["content"],
                    "assistant": assistant["content"],
                    "stop_reason": reply.stop_reason,
                    "ttft_s": reply.ttft_s,
                    "stats": reply.stats.to_dict(),
                }
            )
        t = self.totals
        return {
            "target": str(self.session.config.target),
            "drafter": " + ".join(self.session.drafter.names) if self.session.drafter else None,
            "chat_format": self.conversation.format.name,
            "system": self.conversation.system,
            "turns": turns,
            "session": {
                "replies": len(t.turns),
                "tokens": t.tokens,
                "drafted": t.drafted,
                "accepted": t.accepted,
                "acceptance_rate": t.acceptance_rate,
                "mean_accepted_length": t.mean_accepted_length,
                "tokens_per_step": t.tokens_per_step,
                "tokens_per_s": t.tokens_per_s,
                "plain_tokens_per_s": self.plain_rate.tokens_per_s if self.plain_rate else None,
            },
        }

    def _markdown(self) -> str:
        data = self.transcript()
        lines = [
            f"# specrun chat\n\ntarget: {data['target']}; drafter: {data['drafter'] or 'none (plain)'}; "
            f"format: {data['chat_format']}\n"
        ]
        if data["system"]:
            lines.append(f"**System:** {data['system']}\n")
        for turn in data["turns"]:
            s = turn["stats"]
            lines.append(f"**User:** {turn['user']}\n")
            lines.append(f"**Assistant:** {turn['assistant'].strip()}\n")
            lines.append(
                f"> {s['tokens']} tokens, {s['tokens_per_s']:.1f} tok/s, accepted {s['accepted']}/{s['drafted']} drafts, "
                f"{s['tokens_per_step']:.2f} tokens/step, prefilled {s['prefilled_tokens']}/{s['prompt_tokens']} "
                f"prompt tokens, stop: {turn['stop_reason']}\n"
            )
        s = data["session"]
        lines.append(
            f"Session: {s['replies']} replies, {s['tokens']} tokens, {s['tokens_per_s']:.1f} tok/s, "
            f"accepted {s['accepted']}/{s['drafted']} drafts.\n"
        )
        return "\n".join(lines)


class _Tap:
    """Passes a view's calls through, letting the runner watch the steps too."""

    def __init__(self, view: ReplyView, on_step: Callable[[StepEvent, Stats], None]):
        self.view, self.on_step = view, on_step

    def show(self, pieces) -> None:
        self.view.show(pieces)

    def step(self, event: StepEvent, stats: Stats) -> None:
        self.on_step(event, stats)
        self.view.step(event, stats)
