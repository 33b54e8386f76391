"""Text written in a model's own tokens, word by word and remembered: what grammar drafts and
translated drafts both need of a tokenizer, beyond llama.cpp's tokenize."""

from __future__ import annotations

from specrun.backend import Model

WORDS_KEPT = 65536  # words whose tokens a cache remembers (then it starts afresh)


def exact_tokens(model: Model, pieces: list[bytes], text: bytes) -> list[int] | None:
    """`text` as `model`'s tokenizer writes it, with exactly its bytes; None when it cannot.

    A SentencePiece tokenizer that puts a space in front of any text it is given (its dummy
    prefix) is given a newline first to take the space, and the tokens of the newline dropped.
    """
    tokens = model.tokenize(text, add_special=False, parse_special=False)
    if b"".join(pieces[t] for t in tokens) == text:
        return tokens
    led = model.tokenize(b"\n" + text, add_special=False, parse_special=False)
    spelled = b""
    for i, token in enumerate(led):
        spelled += pieces[token]
        if spelled.endswith(b"\n") and b"".join(pieces[t] for t in led[i + 1 :]) == text:
            return led[i + 1 :]
    return None


def by_words(model: Model, pieces: list[bytes], known: dict[bytes, list[int] | None], text: bytes) -> list[int] | None:
    """`text` in `model`'s tokens, word by word: each space after a word starts a new piece, and
    each piece is tokenized once and remembered in `known`. Where the model has no token across
    such a space (Gemma 3 has one in 262k, BPE pre-tokenizers none), this is the tokenization of
    the whole; a lookup spares the tokenizer, whose tables a decode has just pushed out of the
    CPU's caches."""
    tokens: list[int] = []
    for word in words(text):
        if word not in known:
            if len(known) >= WORDS_KEPT:
                known.clear()
            known[word] = exact_tokens(model, pieces, word)
        encoded = known[word]
        if encoded is None:
            return None
        tokens += encoded
    return tokens


def words(text: bytes) -> list[bytes]:
    """`text` cut before each space that follows something else (a run of spaces stays whole)."""
    cuts = [i for i in range(1, len(text)) if text[i] == 32 and text[i - 1] not in b" \t\n"]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def utf8_runs(data: bytes) -> list[tuple[bool, bytes]]:
    """`data` cut into stretches of valid UTF-8 (True) and of bytes that are not (False)."""
    runs: list[tuple[bool, bytes]] = []
    while data:
        try:
            data.decode("utf-8")
            runs.append((True, data))
            break
        except UnicodeDecodeError as error:
            if error.start:
                runs.append((True, data[: error.start]))
            runs.append((False, data[error.start : error.end]))
            data = data[error.end :]
    return runs


def whole_characters(data: bytes) -> bytes:
    """`data` without an incomplete UTF-8 character at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data  # ASCII: nothing incomplete after it
        if byte >= 0xC0:  # the lead byte of the last character: is its sequence whole?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data
