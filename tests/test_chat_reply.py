"""Streaming a reply: stop strings held back and trimmed, Ctrl-C keeps what was written."""

from specrun.chat.formats import plain_transcript
from specrun.chat.reply import StopScanner, stream_reply
from specrun.core.engine import Engine
from specrun.core.events import Stats, StepEvent, TokenEvent

EOG = 99


def shown(pieces):
    return "".join(text for text, _ in pieces)


def test_text_that_may_start_a_stop_string_is_held_back_until_it_is_decided():
    scanner = StopScanner(["\nUser:"])
    assert shown(scanner.feed("Hello", "target")) == "Hello"
    assert shown(scanner.feed(" world\nUs", "draft")) == " world"  # "\nUs" could become "\nUser:"
    assert shown(scanner.feed("ually", "target")) == "\nUsually"  # it did not
    assert scanner.stop_at is None
    assert shown(scanner.flush()) == ""


def test_a_stop_string_split_over_tokens_ends_the_text_before_it():
    scanner = StopScanner(["\nUser:"])
    released = scanner.feed("Fine.\nU", "target") + scanner.feed("ser", "draft") + scanner.feed(": next", "draft")
    assert shown(released) == "Fine."
    assert scanner.stop_at == 5 and scanner.kept_text == "Fine."
    assert shown(scanner.flush()) == ""


def test_released_text_keeps_each_characters_source():
    scanner = StopScanner([])
    pieces = scanner.feed("ab", "draft") + scanner.feed("c", "draft") + scanner.feed("d", "target")
    assert pieces == [("ab", "draft"), ("c", "draft"), ("d", "target")]


class ScriptedGenerator:
    """Hands a fixed event script to the engine's consumer as Engine.steps does, asking for no
    decode; records being closed."""

    eog = frozenset({EOG})
    run = Engine.run  # the engine's one driver and consumer, over this script

    def __init__(self, pieces, interrupt_after=None):
        self.pieces = pieces  # (token, text, source)
        self.interrupt_after = interrupt_after
        self.stats = Stats()
        self.closed = False

    def steps(self, prompt, max_tokens, consumer):
        yield from ()  # a coroutine like Engine.steps, with no decode to ask for
        stats = self.stats = Stats(prompt_tokens=len(prompt))
        try:
            for i, (token, text, source) in enumerate(self.pieces):
                if i == self.interrupt_after:
                    raise KeyboardInterrupt  # Ctrl-C landing inside the engine
                stats.count_step(1, int(source == "draft"))
                stats.stop_reason = consumer.step(StepEvent(1, int(source == "draft")), stats) or ""
                if not stats.stop_reason:
                    stats.tokens += 1
                    stats.stop_reason = consumer.token(TokenEvent(token, text, source)) or ""
                if stats.stop_reason:
                    break
            else:
                stats.stop_reason = "eog" if self.pieces[-1][0] == EOG else "max_tokens"
        finally:
            self.closed = True
        return consumer.result(stats, lambda tokens: "".join(text for _, text, _ in self.pieces[: len(tokens)]))


class RecordingView:
    def __init__(self):
        self.text = ""
        self.steps = 0

    def show(self, pieces):
        self.text += shown(pieces)

    def step(self, event, stats):
        self.steps += 1


def test_a_stop_string_trims_text_and_rolls_the_tokens_back_to_the_kept_text():
    script = [(1, "Fine", "target"), (2, ".", "draft"), (3, "\nUs", "draft"), (4, "er:", "target"), (5, " more", "target")]
    generator, view = ScriptedGenerator(script), RecordingView()
    reply = stream_reply(generator, [7, 8], 50, ["\nUser:"], view, started=0.0)
    assert reply.stop_reason == "stop_string"
    assert reply.text == view.text == "Fine."
    assert reply.tokens == [1, 2]  # "\nUs" and "er:" are gone
    assert reply.pieces == [("Fine", "target"), (".", "draft")]
    assert generator.closed  # the engine's rollback ran
    assert reply.stats.tokens == 4  # what the engine produced, before trimming


def test_a_stop_string_starting_inside_a_token_keeps_its_text_but_not_the_token():
    script = [(1, "Yes", "target"), (2, ".\nUser:", "target")]
    reply = stream_reply(ScriptedGenerator(script), [7], 50, ["\nUser:"], RecordingView(), started=0.0)
    assert reply.text == "Yes." and reply.tokens == [1]


def test_ctrl_c_keeps_what_was_written_and_closes_the_generator():
    script = [(1, "one", "target"), (2, " two", "draft"), (3, " three", "target")]
    generator, view = ScriptedGenerator(script, interrupt_after=2), RecordingView()
    reply = stream_reply(generator, [7], 50, [], view, started=0.0)
    assert reply.stop_reason == "interrupted"
    assert reply.text == view.text == "one two" and reply.tokens == [1, 2]
    assert generator.closed


def test_the_end_of_generation_token_is_not_kept():
    script = [(1, "Done", "target"), (EOG, "", "target")]
    reply = stream_reply(ScriptedGenerator(script), [7], 50, [], RecordingView(), started=0.0)
    assert reply.stop_reason == "eog" and reply.tokens == [1] and reply.text == "Done"
    assert reply.ttft_s is not None and reply.ttft_s > 0


def test_in_the_plain_transcript_a_reply_ends_at_either_turn_marker_starting_a_line():
    """A base model writes its own next turn as readily as the user's: both end the reply."""
    stops = plain_transcript([{"role": "user", "content": "Hi?"}]).stop
    for marker in ("User:", "Assistant:"):
        script = [
            (1, " Hi", "target"),
            (2, ", Assistant: hi.", "draft"),
            (3, "\n", "target"),
            (4, marker, "draft"),
            (5, " Hi?", "target"),
        ]
        reply = stream_reply(ScriptedGenerator(script), [7], 50, stops, RecordingView(), started=0.0)
        assert reply.stop_reason == "stop_string", marker
        assert reply.text == " Hi, Assistant: hi." and reply.tokens == [1, 2]  # mid-line, the marker is text
