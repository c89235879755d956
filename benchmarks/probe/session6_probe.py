"""Session-6 probe (results: ...-analyze-cost-session6-probe1.log): the two session-6 changes to an analysis,
each on and off, interleaved over rounds on BERT-base bf16 8x512 inference.

  old      two wall-time runs every analysis, the CUPTI teardown launch on the calling thread (session 5)
  warm     one wall-time run once the step is known warm (WarmWalls), the teardown launch inline
  thread   two wall-time runs, the teardown launch on a helper thread (overlapping the event reading)
  both     what brrr does now

Per variant: the median ratio of the analysis to an eager step (each analysis between two eager medians),
the analysis's wall time against the eager step (the single warm run must read as the eager step does), how
many plain runs wall_time took, how long analyze waited for the teardown thread at its end, and the eager
step after the analysis against the one before (a CUPTI left attached would slow it by 20-35%).
Then a process that analyzes with the teardown on and exits must exit (the helper thread is not a daemon).
"""
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import brrr  # noqa: E402,F401
from brrr.analyze import timing  # noqa: E402
from probe_common import bert_base_inference, exit_unless_teardown_thread, median_ms, note_analysis  # noqa: E402

analyze_module = sys.modules["brrr.analyze"]
exit_unless_teardown_thread(timing)
model, ids, step, ceil = bert_base_inference()
ROUNDS = int(os.environ.get("ROUNDS", "10"))

plain_runs = [0]
real_time_once = timing.time_once


def counting_time_once(fn, device):
    plain_runs[0] += 1
    return real_time_once(fn, device)


timing.time_once = counting_time_once

waits = [0.0]
real_finish = analyze_module.finish_teardown


def timed_finish():
    start = time.perf_counter()
    real_finish()
    waits[0] += time.perf_counter() - start


analyze_module.finish_teardown = timed_finish

real_get = analyze_module.WARM_WALLS.get
real_start = timing._TEARDOWN.start


def inline_start(device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    timing._CuptiTeardown._launch(index)


def configure(warm, thread):
    analyze_module.WARM_WALLS.get = real_get if warm else (lambda s: None)
    timing._TEARDOWN.start = real_start if thread else inline_start


VARIANTS = {"old": (False, False), "warm": (True, False), "thread": (False, True), "both": (True, True)}


def eager_ms():
    with torch.no_grad():
        return median_ms(lambda: model(ids), n=10)


for _ in range(3):
    step()
configure(True, True)
start = time.perf_counter()
brrr.analyze(model, ids, ceilings=ceil)
print(f"first analysis in the process: {(time.perf_counter() - start) * 1e3:.1f} ms")

rows = defaultdict(lambda: defaultdict(list))
for r in range(ROUNDS):
    for name, (warm, thread) in VARIANTS.items():
        configure(warm, thread)
        before = eager_ms()
        plain_runs[0], waits[0] = 0, 0.0
        torch.cuda.synchronize()
        start = time.perf_counter()
        analysis = brrr.analyze(model, ids, ceilings=ceil)
        ms = (time.perf_counter() - start) * 1e3
        row = rows[name]
        note_analysis(row, ms, before, eager_ms(), analysis)
        row["plain_runs"].append(plain_runs[0])
        row["teardown_wait_ms"].append(waits[0] * 1e3)
configure(True, True)

print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {ROUNDS} rounds interleaved")
print(f"{'variant':8s} {'ratio':>7s} {'range':>11s} {'analyze':>8s} {'eager':>6s} {'wall/eager':>10s} "
      f"{'runs':>5s} {'wait ms':>8s} {'after/before':>12s}")
for name, row in rows.items():
    med = {k: statistics.median(v) for k, v in row.items()}
    print(f"{name:8s} {med['ratio']:6.2f}x {min(row['ratio']):5.2f}-{max(row['ratio']):5.2f} "
          f"{med['analyze_ms']:7.1f}  {med['eager_ms']:5.2f} {med['wall_vs_eager']:10.3f} "
          f"{statistics.mean(row['plain_runs']):5.2f} {med['teardown_wait_ms']:8.2f} {med['after_vs_before']:12.3f}")
for name, row in rows.items():
    print(name, "wall/eager per round:", " ".join(f"{v:.3f}" for v in row["wall_vs_eager"]))

script = ("import torch, brrr; from brrr.examples import mlp; m, (x,) = mlp(device='cuda', dtype=torch.bfloat16); "
          "a = brrr.analyze(m, x); print('analyzed', len(a.ops), 'ops')")
env = dict(os.environ)
env.pop("TEARDOWN_CUPTI", None)
start = time.perf_counter()
try:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    print(f"API analysis in its own process (teardown on): exit {done.returncode} in "
          f"{time.perf_counter() - start:.1f} s; {done.stdout.strip()} {done.stderr.strip()[-300:]}")
except subprocess.TimeoutExpired:
    print("API analysis in its own process (teardown on): did not exit within 120 s")
