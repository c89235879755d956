"""Lowerings by op family (registered into brrr.compile.lower's tables on import)."""
