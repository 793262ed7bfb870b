#!/usr/bin/env bash
# Spark resource discovery for GPUs (spark.executor.resource.gpu.discoveryScript,
# spark.worker.resource.gpu.discoveryScript): the indexes of the GPUs nvidia-smi sees, as the JSON
# Spark reads, e.g. {"name": "gpu", "addresses": ["0", "1"]}. No nvidia-smi or no GPU: no addresses.
set -u
addresses=""
if command -v nvidia-smi >/dev/null 2>&1; then
  addresses=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | sed -e 's/ //g' -e 's/.*/"&"/' | paste -sd, -)
fi
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
