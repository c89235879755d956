"""GPU acceptance for the "floor" issue: its five patterns as micro-benchmarks, each with brrr at or below eager
and at or below Inductor's better mode (the faster of default and reduce-overhead), 3% slack.

    PYTHONPATH=$PWD python3 benchmarks/acceptance/floor_patterns.py --out $OUT                 # on the GPU machine
    PYTHONPATH=$PWD python3 benchmarks/acceptance/floor_patterns.py --only 5 --out $OUT        # one pattern
    PYTHONPATH=$PWD python3 benchmarks/acceptance/floor_patterns.py --quick --out /tmp/floor   # CPU smoke run

The patterns and their shapes: floor_models.py. Each configuration runs as a sweep configuration (the loop,
its arguments and the files: pattern_bench.py): eager, brrr, Inductor and Inductor reduce-overhead in this
process on the same weights and inputs; the `do_bench` median and back-to-back time of a call, peak memory, the
error against eager and against a higher-precision copy, the top kernels of each compiled backend
(torch.profiler), and what brrr logged (fallbacks, graph breaks, replay choices). The verdicts:
pattern_report.py; the Markdown: floor_report.py. `--quick`: tiny shapes, eager and brrr on the CPU (Triton's
interpreter).

Writes `<out>/<date>-<gpu>-<commit>-floor-patterns.json` and `.md` (default <out>:
benchmarks/results/acceptance-floor/), rewritten after each configuration; a later call on the same day,
GPU and commit adds its configurations to that file, so `--only` can split a run over several calls. A
configuration does not start once `--budget-s` is spent (recorded as skipped). Keep the printed output as the
`.log` of the same name.

On an H100 (torch 2.11, triton 3.6, at 1aca9d1) the whole run takes about 6 minutes: 30-45 s for each
configuration of patterns 1-4, about 90 s for each of pattern 5's two; no backend's peak passed 4 GiB.
"""

import sys

import pattern_bench
import floor_report  # after pattern_bench, which puts sweep/ (sweep_report) on the path

WHAT = "floor-patterns"


def _select(args):
    import floor_models

    return pattern_bench.named(floor_models.patterns(), args.only)


def main(argv=None):
    args = pattern_bench.parser(__doc__, "acceptance-floor", "comma-separated configuration names or pattern "
                                                             "numbers (1-5)").parse_args(argv)
    return pattern_bench.run(args, pattern_bench.Bench(WHAT, "floor", _select, floor_report.markdown))


if __name__ == "__main__":
    sys.exit(main())
