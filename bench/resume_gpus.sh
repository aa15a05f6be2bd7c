#!/usr/bin/env bash
# Distributed resume on 2 GPUs (NCCL), run from the repository root on a 2-GPU host:
# kill -9 the whole --gpus 2 job part-way, --resume, compare
# with an uninterrupted one-process run bit for bit.
set -u
export PYTHONPATH=src
D=/tmp/rg; rm -rf $D; mkdir -p $D
python -c "
import numpy as np; rng = np.random.default_rng(0)
np.save('$D/x.npy', (rng.standard_normal((1500000, 64)) + 5).astype(np.float32))"
t0=$SECONDS; python -m knng graph $D/x.npy -k 10 -o $D/one --no-progress > $D/one.log 2>&1; echo "one-process rc=$? $((SECONDS-t0)) s"
for delay in ${DELAYS:-9 14 18 24}; do
  rm -rf $D/two $D/.two.knng-work
  setsid python -m knng graph $D/x.npy -k 10 --gpus 2 -o $D/two --checkpoint-interval 0 --no-progress > $D/two.log 2>&1 &
  pid=$!; sleep $delay; kill -9 -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  echo "killed after ${delay}s; work area: $(ls $D/.two.knng-work 2>/dev/null | tr '\n' ' '); results: $(ls $D/two 2>/dev/null | tr '\n' ' ')"
  cat $D/.two.knng-work/rank-0-of-2/state.json 2>/dev/null | python -c "import json,sys; s=json.load(sys.stdin); print('saved step', s.get('step'))" 2>/dev/null
  python -m knng graph $D/x.npy -k 10 --gpus 2 -o $D/two --resume --no-progress > $D/resume.log 2>&1; rc=$?
  echo "resume rc=$rc"; grep -i "resumed\|wrote" $D/resume.log
  python -c "
import numpy as np
a, b = np.load('$D/one/indices.npy'), np.load('$D/two/indices.npy')
c, d = np.load('$D/one/distances.npy'), np.load('$D/two/distances.npy')
print('identical to one process:', np.array_equal(a, b) and np.array_equal(c, d))"
done
tail -5 $D/two.log
