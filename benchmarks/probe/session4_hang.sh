export PYTHONPATH=$PWD BRRR_CACHE_DIR=/tmp/bc PYTHONUNBUFFERED=1
W='import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True)'
python3 -c "$W; from brrr.cli import main; sys.argv=['brrr']+sys.argv[1:]; main()" analyze --example mlp --device cuda > $OUT/h_cli.log 2>&1 &
P1=$!
python3 -c "$W; from brrr.cli import main; sys.argv=['brrr']+sys.argv[1:]; main()" ceilings > $OUT/h_ceil.log 2>&1 &
P2=$!
python3 -c "$W
import torch, brrr
from brrr.examples import build_example
m, (x,) = build_example('mlp', device='cuda')
brrr.analyze(m, x, progress=True); print('end')" > $OUT/h_api_progress.log 2>&1 &
P3=$!
python3 -c "$W
import torch, brrr
from brrr.examples import build_example
m, (x,) = build_example('mlp', device='cuda')
brrr.analyze(m, x); print('end')" > $OUT/h_api.log 2>&1 &
P4=$!
TEARDOWN_CUPTI=0 python3 -c "$W; from brrr.cli import main; sys.argv=['brrr']+sys.argv[1:]; main()" analyze --example mlp --device cuda > $OUT/h_cli_noteardown.log 2>&1 &
P5=$!
sleep 45
for p in $P1 $P2 $P3 $P4 $P5; do if kill -0 $p 2>/dev/null; then echo "$p alive"; kill -USR1 $p; sleep 1; cat /proc/$p/task/*/comm | sort | uniq -c | tr '\n' ' '; echo; else wait $p; echo "$p exited rc=$?"; fi; done
sleep 2
for p in $P1 $P2 $P3 $P4 $P5; do kill -9 $p 2>/dev/null; done
for f in $OUT/h_*.log; do echo "== $f"; grep -v USDT $f | grep -A30 "Thread\|end$" | head -60; done
