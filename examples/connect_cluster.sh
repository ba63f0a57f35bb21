#!/usr/bin/env bash
# Start a scheduler and two workers by hand (one offering a GPU slot), then train on them.
# Every process binds to 127.0.0.1; stop them with the printed process ids.
set -euo pipefail
dask scheduler --host 127.0.0.1 --port 8786 --dashboard-address 127.0.0.1:8787 &
sched=$!
sleep 3
dask worker tcp://127.0.0.1:8786 --host 127.0.0.1 --nthreads 1 --name cpu0 --resources "CPU=1" &
w0=$!
dask worker tcp://127.0.0.1:8786 --host 127.0.0.1 --nthreads 1 --name gpu0 --resources "CPU=1,GPU=1" &
w1=$!
trap 'kill $w0 $w1 $sched' EXIT
sleep 5
# The learner asks for GPU=1 and lands on gpu0; rollouts prefer workers without a GPU.
daskrl train graphs/ppo.py --scheduler tcp://127.0.0.1:8786 --steps 100000 --out runs/example-remote
