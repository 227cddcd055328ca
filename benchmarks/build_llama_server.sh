#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` from the llama.cpp sources vendored in the llama-cpp-python source
# distribution (the same llama.cpp the llama.cpp runtime of adalayers runs), once, into a cache folder:
#
#     benchmarks/build_llama_server.sh            # prints the binary's path (builds it when missing)
#
# Beside the binary (in the same folder) are llama.cpp's shared libraries of the same build (libllama.so,
# libggml*.so, libmtmd.so): LLAMA_CPP_LIB_PATH=<that folder> makes llama-cpp-python (and so adalayers'
# llama.cpp runtime and `python -m llama_cpp.server`) load them instead of its own, so that
# benchmarks/llm_server.py runs all its servers on one build of llama.cpp.
#
# Settings (environment): LLAMA_CPP_PYTHON_VERSION (0.3.36), JOBS (2), the cache folder LLAMA_SERVER_CACHE
# (~/.cache/adalayers/llama-server/$LLAMA_CPP_PYTHON_VERSION), GGML_CPU_FLAGS (cmake -D options for the CPU
# kernels; default: the x86 features /proc/cpuinfo reports, AMX left out). The build is the server target
# alone (no tests, no examples, no curl: the server reads local files only), Release, shared libraries.
# AMX is left out because a CPU may report it while the kernel does not let processes use it (a
# Firecracker VM here): llama.cpp's AMX kernels then fault in llama_decode on quantized GGUF files, as
# does a llama-cpp-python that pip built with -march=native on such a machine. A finished build is
# reused: $CACHE/.complete is written last, so an interrupted build is picked up again.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
CACHE="${LLAMA_SERVER_CACHE:-$HOME/.cache/adalayers/llama-server/$VERSION}"
BIN="$CACHE/build/bin/llama-server"

if [[ -x "$BIN" && -f "$CACHE/.complete" ]]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$CACHE"
SRC="$CACHE/src"
if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
    DL="$CACHE/sdist"
    mkdir -p "$DL"
    # the source distribution, not a wheel: it carries vendor/llama.cpp
    if ! ls "$DL"/llama[-_]cpp[-_]python-"$VERSION".tar.gz >/dev/null 2>&1; then
        python -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DL" >&2
    fi
    rm -rf "$SRC" "$CACHE/unpack"
    mkdir -p "$CACHE/unpack"
    tar -xzf "$(ls "$DL"/llama[-_]cpp[-_]python-"$VERSION".tar.gz | head -1)" -C "$CACHE/unpack"
    mv "$CACHE"/unpack/* "$SRC"
    rmdir "$CACHE/unpack"
fi
if [[ -z "${GGML_CPU_FLAGS+x}" ]]; then
    GGML_CPU_FLAGS="-DGGML_NATIVE=OFF"
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI avx512f:AVX512 \
                avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
        if [[ "$flags" == *" ${pair%%:*} "* ]]; then on=ON; else on=OFF; fi
        GGML_CPU_FLAGS+=" -DGGML_${pair##*:}=$on"
    done
    GGML_CPU_FLAGS+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
fi
echo "cmake CPU flags: $GGML_CPU_FLAGS" >&2
# shellcheck disable=SC2086  (GGML_CPU_FLAGS is a list of options)
cmake -S "$SRC/vendor/llama.cpp" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=ON $GGML_CPU_FLAGS >&2
cmake --build "$CACHE/build" --target llama-server -j "$JOBS" >&2
touch "$CACHE/.complete"
echo "$BIN"
