"""libllama loads before numpy in every entry point, and `specrun doctor` tries a model load in a
child process. On a CUDA build a model load crashed whenever numpy had been imported first
(docs/troubleshooting.md); on a CPU build nothing crashes either way, so these tests check the
order itself, and that a load after numpy works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specrun.backend import probe
from specrun.cli.doctor import first_gpu_of_each_backend

ROOT = Path(__file__).parent.parent
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
WITHOUT_LLAMA = {"generated_models.py"}  # writes GGUFs while llama.cpp builds, and never loads it

# Runs a program under an audit hook that records, in order, each library ctypes loads and each
# module imported, then prints whether libllama came before numpy (or that neither was loaded).
WATCH = """
import runpy, sys
order = []
def hook(event, args):
    if event == "ctypes.dlopen" and "llama" in str(args[0]) and "libllama" not in order:
        order.append("libllama")
    elif event == "import" and args[0] == "numpy" and "numpy" not in order:
        order.append("numpy")
sys.addaudithook(hook)
kind, target, *argv = sys.argv[1:]
sys.argv = [target, *argv]
if kind == "path":  # as `python SCRIPT` runs it: its folder first on the path
    sys.path.insert(0, target.rpartition("/")[0])
try:
    runpy.run_module(target, run_name="__main__") if kind == "module" else runpy.run_path(target, run_name="__main__")
except SystemExit:
    pass
print("ORDER", ",".join(order))
"""


def load_order(kind: str, target: str, *argv: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", WATCH, kind, target, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("ORDER")]
    assert lines, result.stdout[-2000:] + result.stderr[-2000:]
    return [name for name in lines[-1].removeprefix("ORDER").strip().split(",") if name]


def test_the_cli_loads_libllama_before_numpy(tiny):
    order = load_order("module", "specrun", "generate", "--target", str(tiny["target"]), "-n", "2", "-c", "256", "the cat")
    assert order[:2] == ["libllama", "numpy"]


def test_the_python_api_loads_libllama_before_numpy(tiny, tmp_path):
    program = tmp_path / "use_api.py"
    program.write_text(
        f"import specrun\nwith specrun.load({str(tiny['target'])!r}, n_ctx=256) as s:\n    s.generate('the cat', max_tokens=2)\n"
    )
    assert load_order("path", str(program))[:2] == ["libllama", "numpy"]


@pytest.mark.parametrize("script", SCRIPTS, ids=[script.name for script in SCRIPTS])
def test_each_script_loads_libllama_before_numpy(script):
    order = load_order("path", str(script), "--help")
    if script.name in WITHOUT_LLAMA:
        assert "libllama" not in order
    else:
        assert "numpy" not in order or order[0] == "libllama"


def test_a_model_loads_after_numpy_was_imported_first(tiny):
    code = (
        "import numpy, specrun\n"
        f"with specrun.load({str(tiny['target'])!r}, n_ctx=256) as s:\n"
        "    print(len(s.generate('the cat', max_tokens=3).tokens))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "3"


def test_the_probe_loads_a_tiny_model_in_a_child_process():
    assert probe.try_load("CPU") == "ok"
    assert probe.try_load("NoSuchDevice0").startswith("failed: ")
    assert "no device named NoSuchDevice0" in probe.try_load("NoSuchDevice0")


def test_a_crashed_child_is_reported_by_its_signal():
    assert probe.outcome(-11, "") == "crashed (SIGSEGV)"
    assert probe.outcome(-200, "") == "crashed (signal 200)"
    assert probe.outcome(1, "Traceback\n  ...\nSystemExit: the logits on CUDA0 are not finite\n") == (
        "failed: SystemExit: the logits on CUDA0 are not finite"
    )
    assert probe.outcome(3, "") == "failed: exit status 3"


def test_doctor_tries_the_first_gpu_of_each_backend():
    devices = [
        {"name": "CPU", "type": "CPU"},
        {"name": "CUDA0", "type": "GPU"},
        {"name": "CUDA1", "type": "GPU"},
        {"name": "Vulkan0", "type": "GPU"},
        {"name": "RPC[127.0.0.1:50052]", "type": "GPU"},
    ]
    assert first_gpu_of_each_backend(devices) == ["CUDA0", "Vulkan0"]  # an RPC server's: `doctor --rpc`


def test_doctor_says_when_there_is_no_gpu_to_try():
    result = subprocess.run(
        [sys.executable, "-m", "specrun", "doctor", "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert '"gpu_load": {}' in result.stdout
