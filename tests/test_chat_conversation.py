"""The chat conversation as exact tokens: each turn appends only its new text's tokens."""

import pytest
from llama_cpp import llama_chat_format as lcf
from tinymodels import write_tiny_llama

from specrun.backend import Model
from specrun.chat.conversation import Conversation
from specrun.chat.formats import PLAIN, ChatFormat, choose_format
from specrun.errors import SpecrunError

# A Jinja template in the style of real GGUFs; it trims message content like Gemma's does.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def model(tiny):
    m = Model(tiny["target"])
    yield m
    m.close()


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    m = Model(write_tiny_llama(tmp_path_factory.mktemp("tmpl") / "chat.gguf", chat_template=TEMPLATE))
    yield m
    m.close()


def reply_tokens(model, text):
    """Tokens of `text` as a model would generate them mid-conversation (no start-of-text space)."""
    tokens = model.tokenize(text, add_special=False, parse_special=False)
    assert model.detokenize(tokens[1:]) == text  # the tiny vocab's lone leading "▁"
    return tokens[1:]


def talk(conversation, model, exchanges, reserve=16):
    turns = []
    for user, assistant in exchanges:
        turn = conversation.prompt(user, reserve)
        conversation.add_reply(turn, reply_tokens(model, assistant), assistant)
        turns.append(turn)
    return turns


def test_plain_transcript_turns_extend_the_previous_tokens_exactly(model):
    fmt = choose_format(model, None)
    assert fmt.name == PLAIN  # the tiny model has no template
    conversation = Conversation(model, fmt, n_ctx=512, system="Be brief.")
    first, second = talk(conversation, model, [("hello there", " the cat"), ("and the dog", " it was")])
    assert first.tokens[0] == model.bos
    before = first.tokens + reply_tokens(model, " the cat")
    assert second.tokens[: len(before)] == before
    new = second.tokens[len(before) :]
    assert second.new_tokens == len(new)
    # no SentencePiece start-of-text space crept in between the turns
    assert model.render(new) == "\nUser: and the dog\nAssistant:"
    assert second.stops == ("\nUser:", "\nAssistant:")


def test_gguf_template_is_used_and_a_trimmed_reply_keeps_what_the_model_saw(templated):
    fmt = choose_format(templated, None)
    assert fmt.name == "gguf template"
    conversation = Conversation(templated, fmt, n_ctx=512)
    first = conversation.prompt("hello", 16)
    assert first.text == "<s><|user|>hello</s><|assistant|>"  # BOS and EOS written by the template
    assert first.tokens == templated.tokenize(first.text, add_special=False, parse_special=True)
    reply = reply_tokens(templated, " the cat \n")  # the template trims this whitespace
    conversation.add_reply(first, reply, " the cat \n")
    second = conversation.prompt("more", 16)
    assert second.tokens[: len(first.tokens) + len(reply)] == first.tokens + reply
    tail = "</s><|user|>more</s><|assistant|>"  # after "the cat": the trimmed whitespace is not repeated
    assert second.text == first.text + "the cat" + tail  # the rendering, which the next turn's is matched against
    assert second.tokens[len(first.tokens) + len(reply) :] == templated.tokenize(tail, add_special=False, parse_special=True)
    # A third turn still extends the second: the whitespace the template trimmed does not break the match.
    conversation.add_reply(second, reply_tokens(templated, " the dog "), " the dog ")
    third = conversation.prompt("and then", 16)
    assert third.tokens[: len(second.tokens)] == second.tokens
    assert third.new_tokens == len(
        templated.tokenize("</s><|user|>and then</s><|assistant|>", add_special=False, parse_special=True)
    )


def test_a_format_that_rewrites_history_is_tokenized_afresh(model):
    def numbered(messages, **_):  # rewrites every earlier turn when a new one arrives
        n = sum(m["role"] == "user" for m in messages)
        body = "".join(f"{m['role']} of {n}: {m['content']}\n" for m in messages)
        return lcf.ChatFormatterResponse(prompt=body + "assistant:")

    conversation = Conversation(model, ChatFormat("numbered", numbered, "test"), n_ctx=512)
    talk(conversation, model, [("hi", " the cat")])
    turn = conversation.prompt("again", 16)
    expected = [model.bos] + model.tokenize(
        "user of 2: hi\nassistant of 2:  the cat\nuser of 2: again\nassistant:", add_special=False
    )
    assert turn.tokens == expected and turn.new_tokens == len(expected)


def test_oldest_exchanges_are_left_out_when_the_context_is_full(model):
    conversation = Conversation(model, choose_format(model, PLAIN), n_ctx=200)
    talk(conversation, model, [(f"the cat {i}", " it was the dog") for i in range(4)])
    assert len(conversation.exchanges) == 4
    full = len(conversation.prompt("and then", 0).tokens)
    reserve = 200 - full + 20  # 20 tokens too many
    turn = conversation.prompt("and then", reserve)
    assert turn.dropped >= 1 and len(turn.tokens) + reserve <= 200
    assert model.render(turn.tokens).startswith("<s> User: the cat %d" % turn.dropped)
    conversation.add_reply(turn, reply_tokens(model, " ok"), " ok")
    assert len(conversation.exchanges) == 4 - turn.dropped + 1
    assert conversation.exchanges[0][0]["content"] == f"the cat {turn.dropped}"


def test_a_message_too_long_for_the_context_is_a_clear_error(model):
    conversation = Conversation(model, choose_format(model, PLAIN), n_ctx=64)
    with pytest.raises(SpecrunError, match="shorten the message.*--ctx-size"):
        conversation.prompt("the cat " * 40, 16)


def test_registered_llama_cpp_python_format_by_name(model):
    fmt = choose_format(model, "chatml")
    rendered = fmt.render([{"role": "user", "content": "hi"}])
    assert rendered.text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_unknown_chat_format_names_the_choices(model):
    with pytest.raises(SpecrunError, match="unknown --chat-format 'nope': choose one of .*chatml.*gemma.*plain"):
        choose_format(model, "nope")
