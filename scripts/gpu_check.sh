#!/usr/bin/env bash
# specrun on a GPU beside llama.cpp's own tools (a benchmark, not CI): build the llama.cpp that
# llama-cpp-python vendors with CUDA, run specrun on it without preloading anything, and time both
# on generated models of real shapes (scripts/host_time.py --size gpu).
#
# The accelerator machine reaches no registry, so the work is split in two:
#   here:   scripts/gpu_check.sh prepare [DIR]   # sources, wheels and this checkout in DIR (default gpu, ~45 MB);
#                                                # add DIR to .git/info/exclude and carry it
#   there:  bash gpu/specrun/scripts/gpu_check.sh run [DIR]   # ~8 min; everything lands in $OUT
# On the machine: CUDA 13 (nvcc), CMake, ninja, Python 3.12 with numpy, typer, rich, pyyaml, jinja2.
# LIBDIR=<folder with libllama.so and the tools> skips the build; SM=<arch> (default 90) for another GPU;
# SIZE=cpu-small with LIBDIR set is a dry run of the whole script on a CPU build.
set -u
VERSION=0.3.36  # the llama-cpp-python whose llama.cpp specrun runs on (pyproject.toml)

prepare() {
    local dir=${1:-gpu} tmp
    tmp=$(mktemp -d)
    set -e
    mkdir -p "$dir/whl" "$dir/pkg"
    pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$VERSION"
    tar -xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp"
    local src=$tmp/llama_cpp_python-$VERSION
    rm -rf "$dir/llama.cpp" "$dir/pkg/llama_cpp" "$dir/specrun"
    cp -r "$src/vendor/llama.cpp" "$dir/llama.cpp"
    cp -r "$src/llama_cpp" "$dir/pkg/"
    rm -rf "$dir/pkg/llama_cpp/server"
    mkdir -p "$dir/pkg/llama_cpp/lib"
    (cd "$dir/llama.cpp" && rm -rf models docs media benches tests tools/ui .github examples/llama.android examples/llama.swiftui \
        ggml/src/ggml-{vulkan,sycl,metal,cann,opencl,hexagon,et,openvino,webgpu,virtgpu,musa,hip,zdnn,kompute})
    # What specrun imports that the machine's image lacks, for its Python 3.12.
    pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
        --platform manylinux1_x86_64 -d "$dir/whl" "huggingface-hub>=2.4,<3" "httpx2>=2,<3" fastapi pydantic uvicorn \
        httptools diskcache prometheus-client
    (cd "$dir/whl" && rm -f click-* pyyaml-* PyYAML-* tqdm-* fsspec-* filelock-* packaging-* idna-* hf_xet-* h11-*)
    mkdir -p "$dir/specrun"
    git archive HEAD | tar -x -C "$dir/specrun"
    rm -rf "$tmp"
    du -sh "$dir"
}

run() {
    local dir out results site models py build_pid started
    dir=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
    out=${OUT:-/tmp/gpu-check}
    results=$out/results.txt
    site=/tmp/gpu-site
    models=/tmp/gpu-models
    py=${PY:-python3}
    started=$(date +%s)
    mkdir -p "$out" "$site" "$models"
    export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
    log() { echo "[$(($(date +%s) - started)) s] $*" | tee -a "$results"; }
    { nvidia-smi; nvcc --version; $py -V; nproc; free -g; } > "$out/machine.txt" 2>&1
    if [ -z "${LIBDIR:-}" ]; then
        log "build: llama.cpp $VERSION with CUDA, sm_${SM:-90}"
        (cd "$dir/llama.cpp" && cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES="${SM:-90}" -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=ON \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_CCACHE=OFF \
            && cmake --build build -j "$(nproc)" --target llama llama-speculative-simple llama-bench) > "$out/build.log" 2>&1 &
        build_pid=$!
    fi
    $py -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$dir"/whl/*.whl > "$out/pip.log" 2>&1 \
        || log "pip failed (pip.log)"
    rm -rf "$site/llama_cpp" && cp -r "$dir/pkg/llama_cpp" "$site/"
    export PYTHONPATH=$dir/specrun:$site:$dir/llama.cpp/gguf-py
    cd "$dir/specrun" || exit 1
    # The models are written while llama.cpp builds (the 0.8B f32 llama takes most of a minute).
    log "models"
    $py scripts/generated_models.py "$models" "${SIZE:-gpu}" >> "$results" 2>&1 || log "models failed"
    if [ -z "${LIBDIR:-}" ]; then
        wait "$build_pid" || { log "build failed"; tail -60 "$out/build.log" > "$out/build-tail.txt"; exit 1; }
        LIBDIR=$dir/llama.cpp/build/bin
    fi
    # The built libraries find each other by an RPATH into the build folder: copy them beside the bindings.
    cp -a "$LIBDIR"/lib*.so* "$site/llama_cpp/lib/"
    export LD_LIBRARY_PATH=$site/llama_cpp/lib
    checks "$models/${SIZE:-gpu}" "$LIBDIR" "$results" "$py"
    log done
}

checks() {
    local m=$1 bin=$2 results=$3 py=$4
    log "doctor: each GPU backend loads a tiny model in a child process"
    timeout 120 $py -m specrun doctor >> "$results" 2>&1
    echo "doctor exit status $?" >> "$results"
    log "the CLI loads and generates on the GPU, nothing preloaded"
    timeout 120 $py -X faulthandler -m specrun generate --target "$m/target.gguf" -n 16 --temp 0 "the cat sat" \
        >> "$results" 2>&1
    echo "generate exit status $?" >> "$results"
    log "a program that imports numpy before specrun (libllama then loads after numpy)"
    timeout 120 $py -X faulthandler -c "import numpy, specrun
with specrun.load('$m/target.gguf', n_ctx=512) as s: print(len(s.generate('the cat', max_tokens=8).tokens))" >> "$results" 2>&1
    echo "numpy-first exit status $?" >> "$results"
    log "verify costs, every layer offloaded: ms per decode of w rows (how many rows cost about one)"
    timeout 180 $py scripts/verify_costs.py --model "$m/target.gguf" --n-gpu-layers -1 --threads 4 --repeats 3 >> "$results" 2>&1
    log "specrun beside llama-bench and llama-speculative-simple, then the self-draft pair at each k and auto"
    timeout 300 $py scripts/host_time.py --size "${SIZE:-gpu}" --models "${m%/*}" --rounds 2 --threads 4 --k 4 --llama-bin "$bin" \
        --only "^(plain|draft k|self-draft k|eagle3 k|dflash k|mtp|4 streams)" --json "${OUT:-/tmp/gpu-check}/host_time.json" >> "$results" 2>&1
    timeout 240 $py scripts/host_time.py --size "${SIZE:-gpu}" --models "${m%/*}" --rounds 1 --threads 4 --k 1,2,3,4,6,8,auto \
        --only "^self-draft" >> "$results" 2>&1
    log "the draft's and MTP head's threads on every core: the target's pool, a pool of their own (polling or not), none"
    timeout 180 $py scripts/thread_pools.py --size "${SIZE:-gpu}" --models "${m%/*}" --threads "$(nproc)" --rounds 2 --tokens 128 \
        --repeats 2 >> "$results" 2>&1
    log "plain decoding layer by layer beside llama-bench: bare llama.cpp calls, reading the logits, Context.eval, a generation, the decode in C"
    timeout 120 $py scripts/plain_floor.py --size "${SIZE:-gpu}" --models "${m%/*}" --rounds 4 --threads 4 --llama-bin "$bin" \
        >> "$results" 2>&1
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare [DIR] | run [DIR]" >&2; exit 2 ;;
esac
