"""SpecScale: serving PRM-guided test-time scaling with speculative beam search."""

__version__ = "0.1.0"
