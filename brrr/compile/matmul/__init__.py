"""Everything matmul, across the stages (scheduling -> codegen -> **matmul** -> runtime).

Takes: a scheduled `Plan` with its generated `KernelSource`s, through the hook the backend hands the runtime
(`fusion.epilogue_pass`, run by runtime.compiled.generate_all).
Hands on: the plan with each fused matmul's step a `fusion.FusedMatmul`: the product and the pointwise kernel
that reads it (its epilogue), and any cheap kernel that made an operand (its prologue), as one template kernel.

template.py and template_tma.py render brrr's matmul kernel (pointer-based, and TMA persistent for Hopper);
epilogue.py and prologue.py render a kernel's work onto its tile; configs.py holds the tiles; choice.py times
the template against cuBLAS once per problem (cached on disk); template_mm.py calls the template directly;
linear_cross_entropy.py is the chunked linear + cross-entropy custom op the pass of the same name inserts.

Must not import: lowering, backend, explain, runtime.compiled.
The runtime never imports this package: fusion reaches it as a hook, the custom op through torch.ops. From the
runtime it uses only leaves: the launcher's TMA descriptors and the kernel registry's names.
"""
