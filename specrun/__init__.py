"""specrun: exact speculative generation on llama.cpp's token API."""

__version__ = "0.1.0"
