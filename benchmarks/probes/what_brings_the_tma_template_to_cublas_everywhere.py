"""What brings the TMA matmul template to 90% of cuBLAS on BERT's FFN down and GPT-2's LM head?

brrr's TMA persistent template (codegen/matmul_template_tma.py, tile 128x256x64, 8 warps, 3 stages) runs at
93-100% of cuBLAS by device time on 4096^3 and five of the zoo's seven transformer shapes, but 82.3% on BERT's
FFN down (4096 x 768 x 3072) and 84.2% on GPT-2's padded LM head (8192 x 50264 x 768)
(results/acceptance-compile/2026-11-26-h200-f44cb10-matmul-template.log).

Prediction:
- LM head: K is 768, so a tile is 12 K steps and then its epilogue, a masked pointer store of 64 KB that the
  persistent program waits on before its next tile's MMAs. A TMA store (asynchronous, from shared memory), and
  storing the tile in two halves so the conversion's registers and shared memory halve, reaches >= 90%.
- FFN down: 96 tiles of 128x256 on 132 SMs leave 36 SMs idle (73%); no tile of power-of-two sides fills the
  machine (128x128: 192 tiles, 1.45 waves; 128x64: 384, 2.9 waves but half the tile's reuse). The store does not
  matter here; smaller tiles gain a few points at most, short of 90%: only splitting K (stream-K) fills it.

Every kernel is checked against cuBLAS's product, then timed by device time (ten calls replayed from a CUDA
graph, `brrr.bench.timing.time_graph`). bf16, B a Linear weight [N, K].

    PYTHONPATH=$PWD python3 benchmarks/probes/what_brings_the_tma_template_to_cublas_everywhere.py
"""

import sys

import torch
import triton
import triton.language as tl

from brrr.bench.timing import time_graph

SHAPES = {
    "square-4096": (4096, 4096, 4096),
    "bert-ffn-up": (4096, 3072, 768),
    "bert-ffn-down": (4096, 768, 3072),
    "gpt2-qkv": (8192, 2304, 768),
    "gpt2-lm-head-padded": (8192, 50264, 768),
    "llama-mlp-up": (8192, 2816, 1024),
    "llama-mlp-down": (8192, 1024, 2816),
    "llama-qkv": (8192, 2048, 1024),
}
RULE = (128, 256, 64, 8, 3)                         # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
SMALLER = [(128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4),
           (256, 128, 64, 8, 3)]
STORES = {0: "pointer store", 1: "TMA store", 2: "TMA store, two halves"}


@triton.jit
def mm_tma(a_desc, b_desc, c_desc, c_ptr, M, N, K, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, STORE: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        group_id = tile_id // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile_id % group_size_m)
        pid_n = (tile_id % num_pid_in_group) // group_size_m
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if STORE == 0:
            rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]
            rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]
            tl.store(c_ptr + rm * stride_cm + rn, acc.to(tl.bfloat16), mask=(rm < M) & (rn < N))
        elif STORE == 1:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))
        else:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], left.to(tl.bfloat16))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], right.to(tl.bfloat16))


def main():
    from triton.tools.tensor_descriptor import TensorDescriptor
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name(dev)}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}")

    def run(shape_name, tile, store):
        m, n, k = SHAPES[shape_name]
        bm, bn, bk, warps, stages = tile
        a, w, ref = data[shape_name]
        out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        b_desc = TensorDescriptor.from_tensor(w, [bn, bk])
        c_desc = TensorDescriptor.from_tensor(out, [bm, bn // 2 if store == 2 else bn])
        grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

        def call():
            mm_tma[grid](a_desc, b_desc, c_desc, out, m, n, k, out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                         GROUP_M=8, NUM_SMS=sms, STORE=store, num_warps=warps, num_stages=stages)
        try:
            call()
        except Exception as e:
            print(f"{shape_name:20s} {bm}x{bn}x{bk} w{warps} s{stages} {STORES[store]:22s}: "
                  f"{type(e).__name__}: {str(e)[:120]}", flush=True)
            return None
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        ms = time_graph(call, dev).median_s * 1e3
        share = cublas_ms[shape_name] / ms
        print(f"{shape_name:20s} {bm}x{bn}x{bk} w{warps} s{stages} {STORES[store]:22s} {ms * 1e3:8.1f} us "
              f"{100 * share:6.1f}% of cuBLAS  (max diff from cuBLAS {err:.2e})", flush=True)
        return share

    torch.manual_seed(0)
    data, cublas_ms = {}, {}
    for name, (m, n, k) in SHAPES.items():
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
        ref = a @ w.t()
        data[name] = (a, w, ref)
        cublas_ms[name] = time_graph(lambda: torch.mm(a, w.t()), dev).median_s * 1e3
        print(f"{name:20s} cuBLAS {cublas_ms[name] * 1e3:8.1f} us  "
              f"({2 * m * n * k / (cublas_ms[name] * 1e-3) / 1e12:.0f} TFLOP/s)", flush=True)
    print("-- the rule's tile, each store")
    for name in SHAPES:
        for store in STORES:
            run(name, RULE, store)
    print("-- smaller tiles on the shapes of few tiles")
    for name in ("bert-ffn-down", "bert-ffn-up", "gpt2-qkv", "gpt2-lm-head-padded"):
        for tile in SMALLER:
            for store in (0, 2):
                run(name, tile, store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
