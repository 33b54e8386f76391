"""What a GGUF file is, read from its header without loading it into llama.cpp.

- read: vocabulary facts, metadata and tensor sizes, local or over HTTP ranges (`read_local`, `read_keys`).
- arch: what an architecture means for drafting (MTP heads, a recurrent state, rollback).

Below both the draft sources (drafts/) and the front ends that judge pairs (pair/, cli/), which
read the same headers.
"""
