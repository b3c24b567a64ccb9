#!/usr/bin/env bash
# Prepares the two trees bench/gpu_compare_run.sh compares on the GPU machine (which has no javac):
# bench/out/before and bench/out/after, each a `git archive` of its commit with its jar and its
# Java harness (tests/java -> <tree>/bench/out/jvm-classes) built here, with this checkout's venv.
# Usage (repository root): bash bench/prepare_compare_trees.sh BEFORE [AFTER, default HEAD]
# then, through the device tool with carry = [.whl, bench/out, python/cudabridge/_native]:
#   bash bench/gpu_compare_run.sh 5 bench/bench_jvm.py --backend cuda --quick --threads 1 --seconds 0.1 \
#        --copies 10 --n 50000 --rounds 3
set -euo pipefail
before=$1
after=${2:-HEAD}
python=${PYTHON:-$PWD/.venv/bin/python}
for side in before after; do
  commit=$([ $side = before ] && echo "$before" || echo "$after")
  tree=bench/out/$side
  rm -rf "$tree" && mkdir -p "$tree"
  git archive "$commit" | tar -x -C "$tree"
  (cd "$tree" && PYTHONPATH=python "$python" -m cudabridge build >/dev/null &&
   cp=$(PYTHONPATH=python "$python" -m cudabridge classpath) && mkdir -p bench/out/jvm-classes &&
   javac --release 17 -nowarn -cp "$cp" -d bench/out/jvm-classes $(find tests/java -name '*.java') 2>&1 | grep -v '^Note' || true)
  echo "$side: $(git rev-parse --short "$commit") in $tree"
done
