#!/bin/sh
# Spark resource discovery script for the standalone-cluster test (tests/standalone_cluster.py):
# each worker runs it at start (spark.worker.resource.gpu.discoveryScript) and offers what it
# prints. One GPU, address "0": on the emulated device (spark.cudabridge.backend=emulated) that is
# emulated GPU 0 of the executor's own service; every worker may list the same address, as two
# machines with one GPU each would. A real GPU host's script lists nvidia-smi's indices instead
# (Spark ships examples/src/main/scripts/getGpusResources.sh for that).
echo '{"name":"gpu","addresses":["0"]}'
