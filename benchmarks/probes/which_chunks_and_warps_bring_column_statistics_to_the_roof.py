"""Which chunk count and warps per program bring column statistics to the copy roof on this GPU?

brrr's split column reduction cuts the rows into chunks for about SPLIT_COLUMN_PROGRAMS programs of
[64 columns, 8 rows] tiles (4 warps); on an H100 a mirror of channels_last BN statistics read its partial in
38.0 us at 128 chunks with 8 warps against 41.8 at brrr's 256 chunks with 4. Each rule below patches brrr (the
programs the split aims at, the column count from which 8-row steps are taken, and the warps of a [64, 8]
column tile) and times brrr's real kernels over ResNet-50's channels_last BN statistics and some column sums,
then the layout acceptance's statistics case through its own harness.

    PYTHONPATH=$PWD python3 benchmarks/probes/which_chunks_and_warps_bring_column_statistics_to_the_roof.py
"""

import sys

import torch

from brrr.bench.backends import fresh_compile
from brrr.bench.timing import time_graph
from brrr.compile import lower
from brrr.compile.codegen import triton as codegen

RULES = {   # name -> (programs the split aims at, COLUMN_SHORT_MIN_X, warps of a [64, 8] column tile or None)
    "shipped": (1024, 65536, None),
    "w8 half": (512, 32768, 8),
    "w8": (1024, 65536, 8),
    "w2 1.5x": (1536, 65536, 2),
    "w2": (1024, 65536, 2),
}

_gen = codegen.Codegen.gen_reduction
SEEN = []


def patched_gen(warps):
    def gen(self, roots, reds):
        body, meta = _gen(self, roots, reds)
        if warps and meta.get("XBLOCK") == 64 and meta.get("RBLOCK") == 8:
            meta["num_warps"] = warps
        SEEN.append((self.k.name, meta.get("XBLOCK"), meta.get("RBLOCK"), meta.get("num_warps"), meta["grid"]))
        return body, meta
    return gen


def apply(rule):
    programs, short_min_x, warps = RULES[rule]
    lower.SPLIT_COLUMN_PROGRAMS = programs
    codegen.COLUMN_SHORT_MIN_X = short_min_x
    codegen.Codegen.gen_reduction = patched_gen(warps)


def cases():
    bf16 = torch.bfloat16
    out = []
    for shape in ((64, 64, 112, 112), (64, 64, 56, 56), (64, 256, 56, 56), (64, 128, 56, 56), (64, 128, 28, 28),
                  (64, 512, 28, 28), (64, 256, 28, 28), (64, 256, 14, 14), (64, 1024, 14, 14), (64, 512, 14, 14),
                  (64, 512, 7, 7), (64, 2048, 7, 7)):
        x = torch.randn(shape, device="cuda", dtype=bf16).contiguous(memory_format=torch.channels_last)
        out.append((f"var_mean CL {list(shape)}", lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=0), x))
    for shape in ((8192, 3072), (8192, 2304), (8192, 768), (8192, 1024), (4096, 768), (12544, 768)):
        x = torch.randn(shape, device="cuda", dtype=bf16)
        out.append((f"sum(0) {list(shape)}", lambda x: x.sum(0), x))
    return out


def main(only_acceptance=False):
    from brrr.cost.device import get_ceilings
    import triton
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    bw = get_ceilings(torch.device("cuda")).bandwidth
    print(f"copy {bw / 1e9:.0f} GB/s")
    totals = {r: 0.0 for r in RULES}
    for label, fn, x in ([] if only_acceptance else cases()):
        nbytes = x.numel() * x.element_size()
        cells = []
        for rule in RULES:
            apply(rule)
            SEEN.clear()
            compiled = fresh_compile(fn, "brrr", dynamic=False)
            want = fn(x.double()) if "var_mean" in label else fn(x.double())
            got = compiled(x)
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            err = max((g.double() - w).abs().max().item() for g, w in zip(got, want))
            t = time_graph(lambda: compiled(x), "cuda", calls=20).median_s * 1e6
            totals[rule] += t
            tiles = ";".join(f"{xb}x{rb} w{w} g{g[0]}" for _, xb, rb, w, g in SEEN)
            cells.append(f"{rule}: {t:6.1f} us ({nbytes / (t * 1e-6) / bw:4.0%}) [{tiles}] err {err:.1e}")
        print(f"{label:26s} | " + " | ".join(cells), flush=True)
    print("sum over the cases: " + ", ".join(f"{r} {t:.1f} us" for r, t in totals.items()))

    sys.path.insert(0, "benchmarks/acceptance")
    import layout_kernels
    fn, make = layout_kernels.cases(False)["bn_statistics_training"]
    for rep in range(3):
        for rule in RULES:
            apply(rule)
            torch._dynamo.reset()
            data = layout_kernels.measure("bn_statistics_training", fn, make("cuda"), ("brrr",), bw, False)
            row = next(r for r in data["rows"] if r["backend"] == "brrr")
            print(f"acceptance bn_statistics_training, {rule:8s} (pass {rep}): {row['seconds'] * 1e6:6.1f} us "
                  f"{row['fraction_of_copy_bandwidth']:.1%} of copy", flush=True)


if __name__ == "__main__":
    main(only_acceptance="--acceptance" in sys.argv)
