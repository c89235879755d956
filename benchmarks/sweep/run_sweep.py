"""The sweep: brrr judged on 200+ configurations from timm, torchvision, transformers, torchaudio,
torch_geometric and the zoo, against eager and both of Inductor's modes.

    PYTHONPATH=$PWD python3 benchmarks/sweep/run_sweep.py --gpus 4 --out $OUT          # on a 4-GPU machine
    PYTHONPATH=$PWD python3 benchmarks/sweep/run_sweep.py --family timm --gpus 4 --out $OUT
    PYTHONPATH=$PWD python3 benchmarks/sweep/run_sweep.py --worst 15 --kernels --out $OUT   # iterate on the worst
    PYTHONPATH=$PWD python3 benchmarks/sweep/run_sweep.py --quick --out /tmp/sweep      # CPU smoke run

Each configuration (catalog.py) runs every backend in one process on the same weights and inputs
(measure.py): eager, brrr with its defaults, then Inductor's default mode and `reduce-overhead` (last: their
compile workers slow the host). Inductor's rows come from the peer cache (peers.py) when it holds this
configuration for this GPU and these versions; eager is re-timed every run and the cached times scaled by
its ratio. `--remeasure-peers` measures them again.

Workers: with `--gpus N`, this process plans and merges; N workers (this script with `--worker I/N`) each
take configurations of about equal estimated cost, on GPU I alone, pinned to their share of the host's CPUs,
with fresh compile caches of their own. A configuration does not start once a worker's `--budget-s` is spent;
`--previous FILE` carries over every configuration that file measured on this GPU (each keeps the commit it
measured, and the report names every commit), so a sweep cut into several calls goes on where the last stopped. `--share-gpu K` runs K workers on each
GPU at once, for peak memory alone (`torch.cuda.max_memory_allocated` is per process): their times are
contended, so the report compares none of them, and no peer they measure is cached. Results: `<out>/<date>-<gpu>-<commit>.json` and `.md`
(rewritten after every configuration) and the peer cache `<out>/peers.json`.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "zoo"), str(HERE.parent)]   # catalog, measure; run_zoo; result_files

from run_zoo import _ranges, _relay, cpu_shares, fresh_caches, pin_cpus, worker_env  # noqa: E402

RESULTS_DIR = HERE.parent / "results" / "sweep"
DEFAULT_PEERS = RESULTS_DIR / "peers.json"
MERGE_EVERY_S = 15.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for the results (default benchmarks/results/sweep)")
    p.add_argument("--only", help="comma-separated configuration names")
    p.add_argument("--family", help="comma-separated families: timm, torchvision, transformers, others, zoo")
    p.add_argument("--mode", choices=("train", "infer"), help="training or inference configurations only")
    p.add_argument("--worst", type=int, help="the N configurations where brrr did worst against Inductor's "
                                             "better mode in --last (default: the newest sweep result)")
    p.add_argument("--last", help="the result file --worst reads")
    p.add_argument("--kernels", action="store_true", help="record each compiled backend's top kernels")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny models, eager and brrr")
    p.add_argument("--backends", help="comma-separated (default eager,brrr,inductor,inductor-reduce-overhead; "
                                      "--quick: eager,brrr)")
    p.add_argument("--peers", default=str(DEFAULT_PEERS), help="the peer cache to read (default %(default)s)")
    p.add_argument("--remeasure-peers", action="store_true", help="measure Inductor again even where cached")
    p.add_argument("--previous", action="append", default=[],
                   help="a result file whose configurations measured on this GPU are carried over, each with "
                        "its commit")
    p.add_argument("--budget-s", type=float, default=500.0, help="no configuration starts after this many seconds")
    p.add_argument("--rep-ms", type=float, default=200.0, help="do_bench's timed milliseconds per backend")
    p.add_argument("--gpus", default="1", help="N or 'all': one worker per GPU")
    p.add_argument("--share-gpu", type=int, default=1, metavar="K",
                   help="K workers on each GPU at once, for peak memory: their times are not compared and the "
                        "peers they measure are not cached")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse --short HEAD)")
    p.add_argument("--keep-caches", action="store_true", help="keep the existing compile caches")
    p.add_argument("--worker", help=argparse.SUPPRESS)       # I/N
    p.add_argument("--cpus", help=argparse.SUPPRESS)
    p.add_argument("--date", help=argparse.SUPPRESS)
    p.add_argument("--worker-dir", help=argparse.SUPPRESS)   # where workers write; the parent merges from it
    return p.parse_args(argv)


def backends_of(args):
    if args.backends:
        return args.backends.split(",")
    return ["eager", "brrr"] if args.quick else ["eager", "brrr", "inductor", "inductor-reduce-overhead"]


def worst_names(count, last):
    """The `count` configurations of the result file `last` (default: the newest) with the lowest brrr over
    Inductor's better mode, brrr failures first."""
    import sweep_report as report

    if last is None:
        files = sorted(RESULTS_DIR.glob("*.json"), key=lambda p: p.name)
        files = [f for f in files if f.name != "peers.json"]
        if not files:
            raise SystemExit("--worst: no sweep result to read; name one with --last")
        last = files[-1]
    results = json.loads(Path(last).read_text())
    failed = report.summarize(results)["brrr_not_ok"]
    return (failed + [n for n in report.ranked(results) if n not in failed])[:count]


def selected(args):
    import catalog

    configs = catalog.all_configs()
    only = args.only
    if args.worst:
        only = ",".join(worst_names(args.worst, args.last))
    chosen = catalog.select(configs, only, args.family)
    if getattr(args, "mode", None):
        chosen = [c for c in chosen if c.train == (args.mode == "train")]
    return catalog.interleaved(chosen)


def carried_over(paths, device):
    """{name: entry} measured ok on `device` in the `--previous` files, each entry with its commit."""
    out = {}
    for path in paths:
        results = json.loads(Path(path).read_text())
        env = results.get("environment", {})
        if env.get("device") != device:
            continue
        for name, entry in results["configs"].items():
            if entry.get("status") == "ok":
                out[name] = dict(entry, commit=entry.get("commit", env.get("commit")))
    return out


def brrr_logs():
    """brrr's logs of what it decided, as (module, list name) pairs: each configuration records what grew."""
    from brrr.compile import fallbacks
    from brrr.compile.passes import graph_breaks, layouts
    from brrr.compile.runtime import captured_choice, floor, replay_choice

    return {"replay_decisions": replay_choice.DECISIONS, "brrr_fallbacks": fallbacks.LOG,
            "graph_breaks": graph_breaks.LOG, "floor_decisions": floor.DECISIONS,
            "captured_decisions": captured_choice.DECISIONS, "layout_decisions": layouts.DECISIONS}


def _log_line(key, item):
    if key == "brrr_fallbacks":
        return f"{item.scope} {item.graph} {item.what}: {item.reason}"
    return str(item)


def run_config(config, backends, device, cache, versions, quick, rep_ms, profile, measure_fn=None, shared=1):
    """One configuration's entry: rows per backend (peers from the cache where it holds them), or the error.
    With `shared` > 1 workers on this GPU, the times are contended: a cached peer is taken as it is (its
    memory holds; eager's ratio says nothing) and nothing measured here goes into the cache."""
    import torch

    import measure as measuring
    import peers as peer_cache

    measure_fn = measure_fn or measuring.measure
    entry = {"name": config.name, "family": config.family, "train": config.train, "precision": config.precision}
    if shared > 1:
        entry["shared_gpu"] = shared
    logs = brrr_logs()
    marks = {k: len(v) for k, v in logs.items()}
    start = time.perf_counter()
    work = None
    try:
        from brrr.compile.passes import graph_breaks

        graph_breaks.resync()
        work = config.build(device, quick)
        entry["fingerprint"] = measuring.fingerprint(work)
        wanted_peers = [b for b in backends if b in measuring.PEERS]
        key = peer_cache.key(config.name, entry["fingerprint"], *versions)
        cached = cache.lookup(key, wanted_peers) if (cache is not None and wanted_peers) else None
        now = [b for b in backends if b not in wanted_peers or cached is None]
        warmup, rep = (2, 5) if quick else (25, rep_ms)
        rows = measure_fn(config, work, now, device, warmup=warmup, rep=rep, profile=profile)
        if cached is not None and shared == 1 and peer_cache.stale(cached, rows["eager"]):
            fresh = measure_fn(config, work, wanted_peers, device, warmup=warmup, rep=rep, profile=profile)
            peer_rows = {p: fresh[p] for p in wanted_peers if p in fresh}
            rows.update(peer_rows)
            cache.store(key, fresh["eager"], peer_rows, versions.commit, versions.date)
        elif cached is not None:
            rows.update(peer_cache.scaled_rows(cached, rows["eager"]))
        elif cache is not None and wanted_peers and shared == 1:
            cache.store(key, rows["eager"], {p: rows[p] for p in wanted_peers if p in rows},
                        versions.commit, versions.date)
        entry.update(status="ok", rows=rows)
        if profile:
            entry["kernels"] = {b: r["kernels"] for b, r in rows.items() if r.get("kernels")}
    except Exception as e:
        from models import Unavailable

        entry.update(status="unavailable" if isinstance(e, Unavailable) else "error",
                     error=f"{type(e).__name__}: {e}"[:500], traceback=traceback.format_exc()[-3000:])
    entry["elapsed_s"] = time.perf_counter() - start
    for k, items in logs.items():
        entry[k] = [_log_line(k, item) for item in items[marks[k]:] if k != "floor_decisions" or item.tried or item.fraction < 0.3]
    del work
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return entry


class Versions(tuple):
    """(gpu, torch, triton) with the commit and date of this run: the peer cache's key and stamp."""

    def __new__(cls, gpu, torch_version, triton_version, commit, date):
        self = super().__new__(cls, (gpu, torch_version, triton_version))
        self.commit, self.date = commit, date
        return self


def triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


def run(args):
    """This process's share: every selected configuration in turn, the file rewritten after each."""
    import torch

    import sweep_report as report
    from peers import PeerCache
    from result_files import git_commit, result_stem, utc_date

    quick = args.quick
    if quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = "cpu" if quick else "cuda"
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    commit, date = args.commit or git_commit(), args.date or utc_date()
    backends = backends_of(args)
    out_dir = Path(args.worker_dir or args.out or RESULTS_DIR)
    stem = result_stem(out_dir, device_name, commit=commit, date=date)
    if args.worker:
        stem = stem.with_name(f"{stem.name}-gpu{args.worker.split('/')[0]}")
    cache = PeerCache(args.peers) if not args.remeasure_peers else PeerCache(None)
    versions = Versions(device_name, torch.__version__, triton_version(), commit, date)
    results = {"environment": {"device": device_name, "date": date, "commit": commit, "torch": torch.__version__,
                               "triton": triton_version(), "backends": backends, "mode": "quick" if quick else "full",
                               "dynamo": "defaults", "worker": args.worker, "cpus": args.cpus,
                               "peers": str(args.peers), "remeasure_peers": args.remeasure_peers,
                               "shared_gpu": args.share_gpu}, "configs": {}}
    peers_out = stem.with_name(stem.name + "-peers.json") if args.worker else out_dir / "peers.json"
    previous = carried_over(args.previous, device_name)
    started = time.perf_counter()
    for config in selected(args):
        if config.name in previous:
            results["configs"][config.name] = previous[config.name]
            continue
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s or (elapsed > 0 and not quick and elapsed + config.cost > args.budget_s):
            results["configs"][config.name] = {"name": config.name, "family": config.family, "train": config.train,
                                               "precision": config.precision, "status": "skipped",
                                               "error": f"time budget: {elapsed:.0f} s spent"}
            continue
        print(f"[sweep] {config.name} ...", flush=True)
        entry = run_config(config, backends, device, cache, versions, quick, args.rep_ms, args.kernels,
                           shared=args.share_gpu)
        entry["commit"] = commit
        results["configs"][config.name] = entry
        print(f"[sweep] {config.name}: {entry['status']} in {entry['elapsed_s']:.0f} s {one_line(entry)}", flush=True)
        report.write(results, stem)
        if args.share_gpu == 1:
            cache.write(peers_out)
    report.write(results, stem)
    if args.share_gpu == 1:
        cache.write(peers_out)
    if not args.worker:
        print(report.markdown(results), flush=True)
    print(f"[sweep] wrote {stem}.json and .md", flush=True)
    return 0


def one_line(entry):
    import sweep_report as report

    if entry.get("status") != "ok":
        return entry.get("error", "")[:200]
    r = report.ratios(entry)
    rows = entry["rows"]
    parts = [f"{b} {rows[b]['median_s'] * 1e3:.2f} ms" if report._time(rows[b]) else f"{b} {rows[b].get('status')}"
             for b in rows]
    return "; ".join(parts) + f"; brrr/eager {r.get('eager', 0):.2f}x, brrr/best Inductor {r.get('best_inductor', 0):.2f}x" \
        + (f" [{rows['brrr'].get('reason', '')[:120]}]" if rows.get("brrr", {}).get("status") != "ok" else "")


def run_workers(args, count):
    """`count` workers at once, `--share-gpu` of them on each GPU; their files merged into one result and one
    peer cache."""
    import models
    import sweep_report as report
    from peers import PeerCache
    from result_files import git_commit, result_stem, utc_date

    commit, date = args.commit or git_commit(), utc_date()
    out_dir = Path(args.out or RESULTS_DIR)
    work_dir = Path(tempfile.mkdtemp(prefix="brrr-sweep-workers-"))
    shares = [s for s in models.parts(selected(args), count * args.share_gpu) if s]
    cpus = cpu_shares(len(shares))
    procs, relays = [], []
    for i, share in enumerate(shares):
        print(f"[sweep] worker {i} on gpu {i // args.share_gpu}: {len(share)} configurations, ~{sum(c.cost for c in share):.0f} s, "
              f"CPUs {_ranges(cpus[i])}", flush=True)
        cmd = [sys.executable, __file__, "--worker", f"{i}/{len(shares)}", "--cpus", ",".join(map(str, cpus[i])),
               "--date", date, "--commit", commit, "--only", ",".join(c.name for c in share),
               "--worker-dir", str(work_dir), "--budget-s", str(args.budget_s), "--rep-ms", str(args.rep_ms),
               "--peers", args.peers, "--share-gpu", str(args.share_gpu)] + sum((["--previous", p] for p in args.previous), []) + \
            [f for f, on in (("--quick", args.quick), ("--kernels", args.kernels),
                             ("--remeasure-peers", args.remeasure_peers), ("--keep-caches", args.keep_caches)) if on] + \
            (["--backends", args.backends] if args.backends else [])
        procs.append(subprocess.Popen(cmd, env=worker_env(i // args.share_gpu, cpus[i]), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, bufsize=1))
        relays.append(threading.Thread(target=_relay, args=(procs[-1], i), daemon=True))
        relays[-1].start()

    def merge():
        files = sorted(p for p in work_dir.glob("*-gpu*.json") if not p.name.endswith("-peers.json"))
        if not files:
            return None
        results = report.merge(files)
        results["environment"].update(concurrent_gpus=count, shared_gpu=args.share_gpu, worker=None)
        stem = result_stem(out_dir, results["environment"]["device"], commit=commit, date=date)
        report.write(results, stem)
        cache = PeerCache(args.peers)
        for peers_file in sorted(work_dir.glob("*-peers.json")):
            cache.merge(PeerCache(peers_file))
        cache.write(out_dir / "peers.json")
        return results, stem

    while any(p.poll() is None for p in procs):
        time.sleep(MERGE_EVERY_S)
        try:
            merge()
        except (OSError, ValueError, KeyError) as e:
            print(f"[sweep] merge while running: {type(e).__name__}: {e}"[:300], flush=True)
    for relay in relays:
        relay.join(timeout=10)
    done = merge()
    if done is None:
        print("[sweep] no worker wrote a result", flush=True)
        return 1
    results, stem = done
    print(report.markdown(results), flush=True)
    print(f"[sweep] wrote {stem}.json and .md, and {out_dir / 'peers.json'}", flush=True)
    return 0 if all(p.returncode == 0 for p in procs) else 1


def main(argv=None):
    args = parse_args(argv)
    pin_cpus(args.cpus)
    if not args.keep_caches:
        fresh_caches()
    if not args.worker:
        import torch

        visible = torch.cuda.device_count()
        count = max(1, visible) if args.gpus == "all" else int(args.gpus)
        if not args.quick and count > max(visible, 1):
            raise SystemExit(f"--gpus {args.gpus}: {visible} GPU(s) visible")
        if count > 1 or args.share_gpu > 1:
            return run_workers(args, count)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
