"""GPU acceptance for issue 42 ("Layouts chosen for the whole graph") on NCHW convolution nets as users create them.

brrr at or below eager and Inductor's better mode (the faster of default and reduce-overhead, 3% slack) on each of
the issue's four patterns, and over the sweep's convolution nets at least 1.15x that mode in geometric mean, none
more than 10% behind it, none slower than eager.

    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_patterns.py --out $OUT                 # the four patterns
    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_patterns.py --only 1,3 --out $OUT      # some of them
    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_patterns.py --sweep-convnets --resume --out $OUT
    PYTHONPATH=$PWD python3 benchmarks/acceptance/layout_patterns.py --quick --out /tmp/layouts # CPU smoke run

The patterns, their shapes, and which of the sweep's configurations are convolution nets: layout_models.py.
`--sweep-convnets` measures those instead of the patterns (pattern `sweep`): 139 image configurations, most of
them convolution nets, each 35-60 s by the catalog's estimates with Inductor's rows cached, so they
take many calls: `--resume` goes on where the day's file stops, and `--peers benchmarks/results/sweep/peers.json`
takes Inductor's rows from the sweep's cache where it holds them. Each configuration runs as a sweep
configuration (the loop, its arguments and the files: pattern_bench.py), recording what brrr logged, its layout
decisions (brrr.compile.passes.layouts.DECISIONS) among them. The verdicts:
pattern_report.py; the sweep criterion and the Markdown: layout_report.py. `--quick`: tiny shapes, eager and
brrr on the CPU (Triton's interpreter).

Writes `<out>/<date>-<gpu>-<commit>-layout-patterns.json` and `.md` (default <out>:
benchmarks/results/acceptance-layouts/), rewritten after each configuration; the patterns and the sweep's
convolution nets of one day, GPU and commit go into the same file. Keep the printed output as the `.log` of the
same name.

On one H200 (torch 2.11, triton 3.6, at 9e5a9ed) the four patterns took 6.5 minutes (386 s), patterns 3 and 4
alone 3.4 minutes.
"""

import sys

import pattern_bench
import layout_report  # after pattern_bench, which puts sweep/ (sweep_report) on the path

WHAT = "layout-patterns"


def _select(args):
    import layout_models

    every = layout_models.sweep_convnets() if args.sweep_convnets else layout_models.patterns()
    return pattern_bench.named(every, args.only)


def layout_log():
    """{"layout_decisions": brrr's list of them} (the sweep's own logs record them too)."""
    from brrr.compile.passes import layouts

    return {layout_report.LAYOUT_LOG: layouts.DECISIONS}


def main(argv=None):
    p = pattern_bench.parser(__doc__, "acceptance-layouts", "comma-separated configuration names or pattern "
                                                            "numbers (1-4)")
    p.add_argument("--sweep-convnets", action="store_true",
                   help="the sweep's convolution nets (timm, torchvision, transformers' image models) instead")
    args = p.parse_args(argv)
    return pattern_bench.run(args, pattern_bench.Bench(WHAT, "layouts", _select, layout_report.markdown, layout_log))


if __name__ == "__main__":
    sys.exit(main())
