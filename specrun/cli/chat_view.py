"""How a reply looks: a live Rich panel on a terminal, plain text when piped.

Both are fed by `specrun.chat.reply.stream_reply` through `show` and `step`; neither
reaches into the engine.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from specrun.chat.reply import Piece, Reply, SessionStats
from specrun.chat.runner import ChatRunner
from specrun.core.events import Stats, StepEvent
from specrun.drafts.translated import TranslationStats

SOURCE_STYLES = {"draft": "bold cyan", "target": "", "bonus": ""}
LEGEND = Text.assemble(("■ draft guess, accepted", "bold cyan"), "   ", ("■ target's own token", "default"))
REFRESH_S = 0.1  # redrawing costs more than a token of a small model: at most 10 frames a second
FOOTER_ROWS = 4 + 2 + 1  # stats rows and a blank, panel border, ellipsis row


class LeadingSpaceTrimmer:
    """Drops the whitespace a reply starts with (the model's space after "Assistant:")."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, pieces: list[Piece]) -> list[Piece]:
        if self.started:
            return pieces
        kept = []
        for text, source in pieces:
            text = text if self.started else text.lstrip()
            self.started = self.started or bool(text)
            if text:
                kept.append((text, source))
        return kept


class PlainView:
    """Streams the reply's text to stdout, nothing else."""

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stdout
        self.trim = LeadingSpaceTrimmer()

    def show(self, pieces: list[Piece]) -> None:
        text = "".join(t for t, _ in self.trim(pieces))
        if text:
            self.out.write(text)
            self.out.flush()

    def step(self, event: StepEvent, stats: Stats) -> None:
        pass

    def finish(self) -> None:
        self.out.write("\n")
        self.out.flush()


class LivePanel:
    """The reply coloured by who produced each token, with the speculative statistics under it.

    `Live(auto_refresh=False)`: frames are drawn on a throttle from `show`/`step`, and the
    final state is always drawn by `finish`.
    """

    def __init__(self, console: Console, runner: ChatRunner, title: str, started: float):
        self.console = console
        self.runner = runner
        self.title = title
        self.started = started
        self.text = Text()
        self.trim = LeadingSpaceTrimmer()
        self.stats = Stats()
        self.last_drafted: int | None = None  # what the latest step drafted (auto and lookup vary it)
        self.reply: Reply | None = None
        self._drawn_at = 0.0
        self._live = Live(console=console, auto_refresh=False, transient=False)

    def __enter__(self) -> "LivePanel":
        self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        self._live.update(self._render(), refresh=False)
        self._live.stop()  # draws the final frame, uncropped

    def show(self, pieces: list[Piece]) -> None:
        for text, source in self.trim(pieces):
            self.text.append(text, style=SOURCE_STYLES.get(source, ""))
        self._throttled_refresh()

    def step(self, event: StepEvent, stats: Stats) -> None:
        self.stats = stats
        self.last_drafted = event.drafted
        self._throttled_refresh()

    def finish(self, reply: Reply) -> None:
        self.reply = reply
        self.stats = reply.stats

    def _throttled_refresh(self) -> None:
        now = time.perf_counter()
        if now - self._drawn_at >= REFRESH_S:
            self._drawn_at = now
            self._live.update(self._render(), refresh=True)

    def _render(self) -> Panel:
        body = self.text if self.reply else self._tail(self.text)
        return Panel(
            Group(body, Text(""), *self._footer()),
            title=self.title,
            title_align="left",
            subtitle=LEGEND if self.runner.speculative else None,
            border_style="dim",
        )

    def _tail(self, text: Text) -> Text:
        """While streaming, only the last lines that fit, so the stats stay on screen."""
        room = max(self.console.height - FOOTER_ROWS - 2, 3)
        lines = text.wrap(self.console, max(self.console.width - 4, 10))
        if len(lines) <= room:
            return text
        return Text("…\n", style="dim") + Text("\n").join(lines[-room + 1 :])

    def _footer(self) -> list[Text]:
        s = self.stats
        elapsed = s.generate_s if self.reply else max(time.perf_counter() - self.started - s.prefill_s, 1e-9)
        rate = s.tokens / elapsed if elapsed > 0 else 0.0
        totals = self.runner.totals if self.reply else self.runner.totals.with_running(s, elapsed)
        rows = [self._speculation_row(s, totals), self._speed_row(rate)]
        if self.runner.speculative and elapsed > 0:
            rows.append(
                Text.assemble(
                    ("time: draft ", "dim"),
                    f"{s.draft_s / elapsed:.0%}",
                    ("  verify ", "dim"),
                    f"{s.verify_s / elapsed:.0%}",
                    ("  other ", "dim"),
                    f"{max(elapsed - s.draft_s - s.verify_s, 0) / elapsed:.0%}",
                    *translation_cells(s, elapsed),
                )
            )
        if self.reply:
            rows.append(self._turn_row(self.reply))
        return rows

    def _speculation_row(self, s: Stats, totals: Stats) -> Text:
        if not self.runner.speculative:
            return Text("plain decoding (no --draft or --lookup)", style="dim")
        return Text.assemble(
            ("k ", "dim"),
            self.runner.k_label,
            ("" if self.last_drafted is None else (f" (last step drafted {self.last_drafted})", "dim")),
            ("  accepted ", "dim"),
            f"{s.acceptance_rate:.0%}",
            (" this reply, ", "dim"),
            f"{totals.acceptance_rate:.0%}",
            (" session", "dim"),
            ("  mean accepted length ", "dim"),
            f"{s.mean_accepted_length:.2f}",
            ("  tokens/step ", "dim"),
            f"{s.tokens_per_step:.2f}",
        )

    def _speed_row(self, rate: float) -> Text:
        row = Text.assemble(f"{rate:.1f}", (" tok/s", "dim"))
        plain = self.runner.plain_rate
        if self.runner.speculative and plain and plain.tokens_per_s > 0:
            row.append_text(
                Text.assemble(
                    "  ",
                    f"{rate / plain.tokens_per_s:.2f}×",
                    (f" vs plain {plain.tokens_per_s:.1f} tok/s ({plain.how})", "dim"),
                )
            )
        return row

    def _turn_row(self, reply: Reply) -> Text:
        s = reply.stats
        ttft = f"{reply.ttft_s:.2f} s" if reply.ttft_s is not None else "-"
        note = {
            "interrupted": "stopped (Ctrl-C), kept what was written",
            "max_tokens": "hit --max-tokens",
            "context_full": "context full",
            "eog": "end of turn",
            "stop_string": "stop string (next turn)",
        }.get(reply.stop_reason, reply.stop_reason)
        return Text.assemble(
            ("prefilled ", "dim"),
            str(s.prefilled_tokens),
            (f" of {s.prompt_tokens} prompt tokens", "dim"),
            ("  first token after ", "dim"),
            ttft,
            ("  ", ""),
            (note, "yellow" if reply.stop_reason in ("interrupted", "context_full", "max_tokens") else "dim"),
        )


def translation_cells(s: Stats, elapsed: float) -> tuple[tuple[str, str] | str, ...]:
    """For a draft with another vocabulary: the share of its cache re-encoded, and the time translating took."""
    translation = TranslationStats.of(s.counters)
    if translation is None:
        return ()
    return (
        ("  translated: ", "dim"),
        f"{translation.reencoded_share:.0%}",
        (" re-encoded, ", "dim"),
        f"{translation.seconds / elapsed:.1%}",
        (" of the time", "dim"),
    )


def reply_line(reply: Reply) -> str:
    """One line of stats for a piped reply (stderr)."""
    s = reply.stats
    ttft = f"{reply.ttft_s:.2f}s" if reply.ttft_s is not None else "-"
    return (
        f"{s.tokens} tokens, {s.tokens_per_s:.1f} tok/s, accepted {s.accepted}/{s.drafted} drafts "
        f"({s.acceptance_rate:.0%}), {s.tokens_per_step:.2f} tokens/step, prefilled {s.prefilled_tokens}/"
        f"{s.prompt_tokens} prompt tokens, first token {ttft}, stop: {reply.stop_reason}"
    )


def summary_line(totals: SessionStats, runner: ChatRunner) -> str:
    line = (
        f"session: {len(totals.turns)} replies, {totals.tokens} tokens, {totals.tokens_per_s:.1f} tok/s, "
        f"accepted {totals.accepted}/{totals.drafted} drafts ({totals.acceptance_rate:.0%}), "
        f"{totals.tokens_per_step:.2f} tokens/step"
    )
    plain = runner.plain_rate
    if runner.speculative and plain and plain.tokens_per_s > 0 and totals.tokens:
        line += f", {totals.tokens_per_s / plain.tokens_per_s:.2f}x vs plain {plain.tokens_per_s:.1f} tok/s ({plain.how})"
    return line
