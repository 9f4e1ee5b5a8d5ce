#!/usr/bin/env bash
# Makes bench/results/<gpu>/attention_accuracy.{json,md}: accuracy against FP64 at
# N in {384, 640, 768} x D in {16, 32} with compensation on and off, and the determinism sweep.
# Usage (on a GPU machine, after scripts/install.sh): scripts/attention_accuracy.sh [TPF] [DIR]
set -euo pipefail
TPF=${1:-build/tpf}
DIR=${2:-bench/results/h200}
mkdir -p "$DIR"
"$TPF" accuracy --n 384,640,768 --d 16,32 --heads 4 --out "$DIR"
