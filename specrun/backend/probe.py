"""A model load tried in a child process, on one device: a GPU build that crashes inside
llama.cpp's load (a segmentation fault) ends the child, and `specrun doctor` says so in one
line, before a user waits for a download and a crash of their own.

The model is written here, a few kilobytes: one llama layer, 32 wide, random weights.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

N_EMBD, N_HEAD, N_FF = 32, 2, 64
VOCAB = [("<unk>", gguf.TokenType.UNKNOWN), ("<s>", gguf.TokenType.CONTROL), ("</s>", gguf.TokenType.CONTROL)]
VOCAB += [(chr(ord("a") + i), gguf.TokenType.NORMAL) for i in range(26)]
CHILD_TIMEOUT_S = 120  # a first CUDA load compiles nothing, but may initialise several GPUs


def write_probe_model(path: Path) -> Path:
    """A one-layer llama GGUF with a 29-token vocabulary."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_context_length(256)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([text for text, _ in VOCAB])
    writer.add_token_types([kind for _, kind in VOCAB])
    writer.add_token_scores([0.0] * len(VOCAB))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    shapes = {"token_embd.weight": (len(VOCAB), N_EMBD), "output.weight": (len(VOCAB), N_EMBD)}
    shapes |= {f"blk.0.{name}.weight": (N_EMBD, N_EMBD) for name in ("attn_q", "attn_k", "attn_v", "attn_output")}
    shapes |= {"blk.0.ffn_gate.weight": (N_FF, N_EMBD), "blk.0.ffn_up.weight": (N_FF, N_EMBD)}
    shapes |= {"blk.0.ffn_down.weight": (N_EMBD, N_FF)}
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        writer.add_tensor(name, np.ones(N_EMBD, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def load_and_decode(path: Path, device: str) -> None:
    """In the child: load `path` with every layer on `device`, decode two tokens, read the logits."""
    from specrun.backend.context import Context, ContextOptions
    from specrun.backend.model import Model, ModelOptions

    model = Model(path, ModelOptions(n_gpu_layers=-1, devices=(device,)))
    context = Context(model, ContextOptions(n_ctx=64, n_batch=8))
    logits = context.eval([1, 3], 1)
    if not np.isfinite(logits).all():
        raise SystemExit(f"the logits on {device} are not finite")
    context.close()
    model.close()


def try_load(device: str) -> str:
    """'ok', or one line saying how the child's load on `device` failed."""
    with tempfile.TemporaryDirectory(prefix="specrun-probe-") as folder:
        path = write_probe_model(Path(folder) / "probe.gguf")
        code = "import sys; from specrun.backend.probe import load_and_decode; load_and_decode(sys.argv[1], sys.argv[2])"
        try:
            child = subprocess.run(
                [sys.executable, "-c", code, str(path), device], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return f"no answer in {CHILD_TIMEOUT_S} s"
    return outcome(child.returncode, child.stderr)


def outcome(returncode: int, stderr: str) -> str:
    """The child's end in one line: 'ok', the signal that killed it, or its last line of error."""
    if returncode == 0:
        return "ok"
    if returncode < 0:
        try:
            return f"crashed ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"crashed (signal {-returncode})"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"failed: {lines[-1] if lines else f'exit status {returncode}'}"
