"""The `brrr` command: a thin argparse layer over the public API.

    brrr analyze FILE.py:FUNC | --example mlp   [--train --device --dtype --json --png --html --trace
                                                 --verify]
    brrr ceilings [--refresh] [--device] [--json]
    brrr experiment repeat|overhead [--backend] [--png --json]
    brrr explain FILE.py:FUNC | --example mlp   [--train --device --dtype]
    brrr bench FILE.py:FUNC | --example mlp     [--backends eager,inductor,brrr --train --dtype --device --json]

Bad input (BrrrError) is printed as one line and exits with status 2; nothing here holds logic of its own.
"""

import argparse
import os
import sys

from brrr.errors import BrrrError


def _add_target(p, train=True):
    p.add_argument("target", nargs="?", help="FILE.py:FUNC, where FUNC() returns (model_or_callable, example_inputs)")
    p.add_argument("--example", help="a built-in model instead of FILE.py:FUNC: mlp, bert, gpt2, bert-base, gpt2-small")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when there is one)")
    p.add_argument("--dtype", help="cast floating inputs and parameters: fp32, bf16, fp16")
    p.add_argument("--batch", type=int, help="batch size of a built-in --example")
    if train:
        p.add_argument("--train", action="store_true", help="a forward+backward step instead of inference")


def _console():
    from rich.console import Console

    return Console()


def cmd_analyze(args):
    import brrr
    from brrr.target import load_target

    # one analysis, then the process ends: releasing CUPTI afterwards (what the API does, so that later steps
    # in the process run at full speed) would only cost time here, unless --verify times steps after it.
    # The user's own setting wins.
    if not args.verify:
        os.environ.setdefault("TEARDOWN_CUPTI", "0")
    model, inputs, device, _ = load_target(args.target, args.example, args.device, args.dtype, args.batch)
    analysis = brrr.analyze(model, *inputs, train=args.train, device=device, progress=True, verify=args.verify)
    console = _console()
    analysis.print(console)
    for path, save in ((args.json, analysis.save_json), (args.png, analysis.save_png), (args.html, analysis.save_html),
                       (args.trace, analysis.save_trace)):
        if path:
            save(path)
            console.print(f"wrote {path}")


def cmd_ceilings(args):
    import json

    from brrr.cost.device import get_ceilings, print_ceilings
    from brrr.target import parse_device

    ceilings = get_ceilings(parse_device(args.device), refresh=args.refresh, progress=True, apart=False)
    print_ceilings(ceilings, _console())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(ceilings.to_dict(), f, indent=2)


def cmd_experiment(args):
    from brrr.target import parse_device, parse_dtype

    device, dtype = parse_device(args.device), parse_dtype(args.dtype)
    if args.name == "repeat":
        from brrr.experiments import repeat

        repeat.run(backend=args.backend or "inductor", device=device, dtype=dtype, numel=args.numel,
                   max_repeat=args.max_repeat, png=args.png, json_path=args.json, progress=True)
    else:
        from brrr.experiments import overhead

        overhead.run(example=args.example or "mlp", device=device, dtype=dtype, backend=args.backend,
                     png=args.png, json_path=args.json, progress=True)


def cmd_explain(args):
    import brrr
    from brrr.target import load_target

    model, inputs, _, _ = load_target(args.target, args.example, args.device, args.dtype, args.batch)
    print(brrr.explain(model, *inputs, train=args.train))


def cmd_bench(args):
    import json

    import brrr
    from brrr.target import load_target

    model, inputs, _, _ = load_target(args.target, args.example, args.device, args.dtype, args.batch)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    result = brrr.bench(model, *inputs, backends=backends, train=args.train, progress=True)
    result.print(_console())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_dict(), f, indent=2)


def build_parser():
    parser = argparse.ArgumentParser(prog="brrr", description="Make PyTorch programs go brrr: diagnose and fuse.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("analyze", help="count, time and classify every op; roofline, regimes and advice")
    _add_target(p)
    p.add_argument("--json", help="write the analysis as JSON")
    p.add_argument("--png", help="write the roofline plot")
    p.add_argument("--html", help="write a self-contained HTML report")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of the analyzed step (open in ui.perfetto.dev)")
    p.add_argument("--verify", action="store_true",
                   help="apply each remedy (compile, CUDA graphs, TF32, bf16, ...) to a copy of the model and "
                        "measure it beside its prediction")
    p.set_defaults(run=cmd_analyze)

    p = sub.add_parser("ceilings", help="measure (or show cached) bandwidth, matmul rates and launch latency")
    p.add_argument("--device", help="cpu, cuda or cuda:N")
    p.add_argument("--refresh", action="store_true", help="re-measure instead of using the cache")
    p.add_argument("--json", help="write the ceilings as JSON")
    p.set_defaults(run=cmd_ceilings)

    p = sub.add_parser(
        "experiment", help="where this machine's regimes meet: repeat (bandwidth vs compute), overhead (batch)",
        description="repeat: x = x * 2 applied r times for r = 1, 2, 4, ...: the bytes stay the same while the "
                    "arithmetic grows, so the time stays flat while the op is bandwidth-bound and grows past the "
                    "knee where it turns compute-bound. overhead: a model's step timed as its batch doubles: "
                    "while the time stays flat the step is overhead-bound (Python, dispatch, launches); it stops "
                    "once each doubling nearly doubles the time.")
    p.add_argument("name", choices=["repeat", "overhead"],
                   help="repeat: the bandwidth-to-compute knee; overhead: the batch where overhead stops "
                        "dominating")
    p.add_argument("--backend", help="torch.compile backend: inductor (the repeat sweep's default) or brrr; "
                                     "the overhead test runs eager unless given one")
    p.add_argument("--device", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (default fp32)")
    p.add_argument("--numel", type=int, default=None, help="elements of x for the repeat sweep (default: 2^28 on GPU)")
    p.add_argument("--max-repeat", type=int, default=256)
    p.add_argument("--example", help="model for the overhead test (default: mlp)")
    p.add_argument("--png", help="write the plot")
    p.add_argument("--json", help="write the numbers as JSON")
    p.set_defaults(run=cmd_experiment)

    p = sub.add_parser("explain", help="what brrr's compiler fuses, what falls back and why, bytes saved")
    _add_target(p)
    p.set_defaults(run=cmd_explain)

    p = sub.add_parser("bench", help="eager vs inductor vs brrr on the same inputs: time, compile, memory, error")
    _add_target(p)
    p.add_argument("--backends", default="eager,inductor,brrr")
    p.add_argument("--json", help="write the results as JSON")
    p.set_defaults(run=cmd_bench)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except BrrrError as e:
        print(f"brrr: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
