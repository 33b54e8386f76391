"""`specrun chat`: interactive speculative chat with a live panel; plain streamed text when piped."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from specrun.chat.calibration import PlainRate
from specrun.chat.formats import PLAIN, check_format_name, choose_format
from specrun.chat.runner import ChatRunner, check_reply_tokens
from specrun.cli import options as o
from specrun.cli.app import app, err_console
from specrun.cli.chat_view import LivePanel, PlainView, reply_line, summary_line
from specrun.cli.interrupts import CtrlC
from specrun.errors import SpecrunError
from specrun.session import Session
from specrun.settings import SettingError

HELP = """\
Type a message and press Enter. End a line with \\ to continue on the next line, or
put \"\"\" alone on a line to start and end a multi-line block (for pasting).
  /help          this help
  /stats         session statistics and recent turns
  /k N           draft N tokens per step from the next reply on (or /k auto, /k llama.cpp)
  /temp T        sampling temperature from the next reply on (0 = greedy)
  /reset         start a new conversation (keeps the loaded models)
  /save FILE     write the transcript with stats (FILE.json: JSON, else Markdown)
  /quit          leave with a session summary (also Ctrl-D)
Ctrl-C stops the reply being written and keeps what it wrote. Start a message with //
to send text that begins with /."""

PROMPT, MORE = "you> ", "...> "
INSTRUCT_EXAMPLE = "qwen2.5-0.5b"  # an instruct alias (profiles/qwen2.5.yaml) small enough to fetch and run on any CPU
BLOCK = '"""'
QUIT = object()


@app.command()
@o.model_options
def chat(
    lookup: o.Lookup = False,
    store_tokens: o.StoreTokens = 0,
    k: o.K = "auto",
    system: Annotated[
        Optional[str], typer.Option("--system", help="System message for the conversation (default: none).")
    ] = None,
    chat_format: o.ChatFormat = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Most tokens per reply.")] = 512,
    *,
    model: o.ModelOptions,
) -> None:
    """Chat with the target, drafting by --draft model or --lookup; a live panel shows the speculation."""
    check_reply_tokens(max_tokens, model.ctx_size)  # before minutes of model loading
    if chat_format not in (None, PLAIN):
        check_format_name(chat_format)  # before minutes of model loading
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    config = model.session_config(lookup, k, store_tokens)
    with Session(config) as session:
        fmt = choose_format(session.target_model, chat_format)
        if fmt.source == "no chat template in the model":
            base_model_notes(config.target.name)
        plain_rate = PlainRate.calibrate(session) if session.drafter is not None else None
        runner = ChatRunner(session, fmt, max_tokens, system, plain_rate)
        if plain_rate is not None:
            note(f"plain decoding: {plain_rate.tokens_per_s:.1f} tok/s ({plain_rate.how})")
        else:
            note("no --draft or --lookup: plain decoding")
        shell = InteractiveShell(runner, Console(), _title(config)) if interactive else PipedShell(runner)
        shell.run()
        note(summary_line(runner.totals, runner), style="")


def base_model_notes(name: str) -> None:
    """A model without a chat template is most likely a base model: it continues text, so a
    newcomer asking it a question gets the question back. Say so, and how to chat instead."""
    note(
        f"note: {name} has no chat template, so it is likely a base model, which continues text rather than "
        "answering (it may repeat your message): using a plain User:/Assistant: transcript, where a reply ends "
        "at a line starting User: or Assistant:"
    )
    note(
        f"note: to chat, give an instruct model: --target {INSTRUCT_EXAMPLE} (an alias, fetched once; "
        "`specrun models --aliases` lists the others) or --target PATH.gguf; --chat-format picks another format"
    )


def note(text: str, style: str = "dim") -> None:
    """A line on stderr, never wrapped (scripts read these lines)."""
    err_console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def _title(config) -> str:
    lookup = "prompt lookup" if config.lookup else ""
    store = "store" if config.store_tokens else ""
    drafter = " + ".join(filter(None, [lookup, store, config.draft.name if config.draft else ""])) or "plain"
    return f"{config.target.name} ← {drafter}"


def read_message(read_line: Callable[[str], str]) -> str:
    """One message: a line, lines joined by trailing backslashes, or a \"\"\" block.

    Raises EOFError only when no text was read at all.
    """
    first = read_line(PROMPT)
    if first.strip() == BLOCK:
        lines: list[str] = []
        try:
            while (line := read_line(MORE)).strip() != BLOCK:
                lines.append(line)
        except EOFError:
            pass
        return "\n".join(lines)
    lines = [first]
    try:
        while lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1]
            lines.append(read_line(MORE))
    except EOFError:
        pass
    return "\n".join(lines)


class Shell:
    """The read-reply loop and the slash commands; subclasses say how to read and show."""

    def __init__(self, runner: ChatRunner, console: Console):
        self.runner = runner
        self.console = console  # where command output goes

    def run(self) -> None:
        while True:
            try:
                message = read_message(self.read_line)
            except EOFError:
                return
            except KeyboardInterrupt:
                self.console.print("\n[dim](Ctrl-D or /quit to leave)[/]")
                continue
            if not message.strip():
                continue
            if message.startswith("/") and not message.startswith("//"):
                if self.command(message) is QUIT:
                    return
                continue
            try:
                self.send(message[1:] if message.startswith("//") else message)
            except KeyboardInterrupt:  # a second Ctrl-C, while the first one's step was still running
                self.interrupted()

    def interrupted(self) -> None:
        self.console.print("\n[dim](interrupted)[/]")

    def read_line(self, prompt: str) -> str:
        raise NotImplementedError

    def send(self, message: str) -> None:
        raise NotImplementedError

    def failed(self, error: SpecrunError) -> None:
        """A command or message the user can fix; the interactive shell carries on."""
        raise error

    def command(self, line: str) -> object:
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        try:
            if name in ("/quit", "/exit"):
                return QUIT
            if name == "/help":
                self.console.print(HELP, highlight=False, markup=False)
            elif name == "/stats":
                self.console.print(summary_line(self.runner.totals, self.runner), highlight=False, soft_wrap=True)
                self.console.print(turns_table(self.runner))
            elif name == "/k":
                if not arg:
                    raise SpecrunError("/k needs a value: /k N, /k auto or /k llama.cpp")
                self.runner.set_k(arg)
                self.console.print(f"[dim]k = {self.runner.k_label} from the next reply on[/]")
            elif name == "/temp":
                self.runner.set_temperature(_number(arg, float, "/temp T"))
                self.console.print(f"[dim]temperature = {self.runner.sampler.temperature:g} from the next reply on[/]")
            elif name == "/reset":
                self.runner.reset()
                self.console.print("[dim]new conversation (session statistics kept)[/]")
            elif name == "/save":
                if not arg:
                    raise SpecrunError("/save needs a file name: /save FILE")
                self.runner.save(Path(arg))
                self.console.print(f"[dim]saved {len(self.runner.replies)} turns to {arg}[/]")
            else:
                raise SpecrunError(f"unknown command {name}: /help lists the commands")
        except SettingError as exc:  # the slash command names the setting
            self.failed(SpecrunError(exc.phrase(name)))
        except SpecrunError as exc:
            self.failed(exc)
        return None


def _number(text: str, kind: type, usage: str):
    try:
        return kind(text)
    except ValueError:
        raise SpecrunError(f"{usage} needs a number, but got {text!r}") from None


class InteractiveShell(Shell):
    def __init__(self, runner: ChatRunner, console: Console, title: str):
        super().__init__(runner, console)
        self.title = title
        try:
            # For its side effect, and only here: line editing and history for input() at a terminal.
            import readline  # noqa: F401
        except ImportError:  # pragma: no cover - e.g. Windows without pyreadline
            pass
        console.print("[dim]/help lists the commands; Ctrl-C stops a reply; Ctrl-D or /quit leaves[/]")

    def read_line(self, prompt: str) -> str:
        return input(prompt)

    def failed(self, error: SpecrunError) -> None:
        self.console.print(f"[red]error:[/] {error}", highlight=False)

    def send(self, message: str) -> None:
        started = time.perf_counter()
        try:
            turn = self.runner.prepare(message)
        except SpecrunError as exc:
            return self.failed(exc)
        if turn.dropped:
            self.console.print(f"[yellow]context full: left out the oldest {turn.dropped} exchange(s)[/]")
        with CtrlC() as ctrl_c, LivePanel(self.console, self.runner, self.title, started) as panel:
            panel.finish(self.runner.reply(turn, panel, started, cancelled=ctrl_c.pressed))


class PipedShell(Shell):
    """For scripts: each message's reply on stdout, one stats line per reply on stderr."""

    def __init__(self, runner: ChatRunner):
        super().__init__(runner, err_console)

    def read_line(self, prompt: str) -> str:
        if sys.stdin.isatty():
            sys.stderr.write(prompt)
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def send(self, message: str) -> None:
        turn = self.runner.prepare(message)
        if turn.dropped:
            note(f"context full: left out the oldest {turn.dropped} exchange(s)", style="")
        view = PlainView()
        with CtrlC() as ctrl_c:
            reply = self.runner.reply(turn, view, cancelled=ctrl_c.pressed)
        view.finish()
        note(reply_line(reply), style="")
        if reply.stop_reason == "interrupted":
            raise KeyboardInterrupt  # in a script Ctrl-C ends the run (exit 130), after the partial reply

    def interrupted(self) -> None:
        raise KeyboardInterrupt


def turns_table(runner: ChatRunner) -> Table:
    """The last ten turns: how much of each prompt had to be prefilled, and how soon the reply began."""
    t = runner.totals
    table = Table(box=None, header_style="dim")
    for column in ("turn", "prompt tokens", "prefilled", "first token", "tokens", "stop"):
        table.add_column(column, justify="right")
    first = max(len(t.turns) - 10, 0)
    for i, turn in enumerate(t.turns[first:], start=first + 1):
        ttft = f"{turn.ttft_s:.3f} s" if turn.ttft_s is not None else "-"
        table.add_row(str(i), str(turn.prompt_tokens), str(turn.prefilled_tokens), ttft, str(turn.tokens), turn.stop_reason)
    return table
