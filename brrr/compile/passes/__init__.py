"""FX-graph passes before lowering (backend -> **passes** -> lowering).

Takes: Dynamo's captured FX graph (attention_mask, linear_cross_entropy, graph_breaks, specialize) or
AOTAutograd's core-ATen graphs (partition picks what a forward saves; pad_matmuls pads unaligned matmuls).
Hands on: the same graphs rewritten in place, AOTAutograd's partition function, and `PerShape`, which compiles a
graph once per shape where symbolic sizes cannot be planned. The backend calls each pass; no pass calls another
stage.

Must not import: lowering, scheduling, codegen, runtime, backend, explain.
The linear + cross-entropy rewrite inserts the custom op that matmul/linear_cross_entropy.py defines.
"""
