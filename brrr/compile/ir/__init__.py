"""brrr's loop-level IR, the vocabulary every later stage speaks (lowering -> **ir** -> scheduling -> codegen).

nodes.py: tensor nodes as functions from an output index to a Value (Pointwise, Reduction, Buffer, ...);
indexing.py: affine index expressions (`Ix`), how views rewrite an index without moving data; sizes.py: symbolic
sizes, planned with the SymInts Dynamo captured; mathops.py: the math ops, one table lowering checks and codegen
renders.

Takes nothing from the other stages and hands on these types.
Must not import: passes, lowering, scheduling, codegen, matmul, runtime, backend, explain, cache, fallbacks.
"""
