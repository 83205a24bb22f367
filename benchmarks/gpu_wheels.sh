#!/usr/bin/env bash
# The Python packages the lent GPU machine's image lacks (it has torch, transformers, peft, pyarrow, tensorboard,
# no package registry), as wheels in .whl for benchmarks/gpu_check.sh: Python 3.12, manylinux x86-64. DeepSpeed
# is built here as a pure-Python wheel (its ops JIT-compile there with that machine's nvcc). Run from the
# repository root after `make install`; .whl is git-ignored through .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2> /dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation deepspeed==0.19.8 -w .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 hjson==3.1.0 \
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
du -sh .whl
