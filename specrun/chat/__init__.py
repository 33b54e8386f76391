"""Multi-turn chat over a speculative session: formats, the exact token transcript, replies.

Nothing here knows about Rich or the terminal; `specrun.cli.chat` is the interactive shell.
"""
