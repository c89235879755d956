"""The seeds' experiments as commands (Horace He, "Making Deep Learning Go Brrrr From First Principles").

- repeat:    `x*2` repeated r times under a fusing compiler; runtime, FLOP/s and bandwidth against r show the
             move from bandwidth-bound to compute-bound (`brrr experiment repeat`).
- overhead:  double the batch until runtime grows in proportion; below that batch the model is
             overhead-bound (`brrr experiment overhead`).
- cos_chain: fused `x.cos().cos()` costs what eager `x.cos()` costs; eager `x.cos().cos()` twice that.

Shared pieces: knee (pure functions that read a sweep), common (device, versions, ceilings, JSON).
"""
