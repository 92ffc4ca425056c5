"""PRM verification: input formats, the batched verifier with its step-boundary cache, the profiler."""

from specscale.verify.formats import (
    FORMATS,
    PRMFormat,
    PRMInput,
    QwenMathPRMFormat,
    RLHFlowFormat,
    clean_steps,
    format_name_for,
    make_format,
)
from specscale.verify.prm import Verifier, VerifierConfig, VerifierStats
from specscale.verify.profile import load_lv_threshold

__all__ = [
    "FORMATS",
    "PRMFormat",
    "PRMInput",
    "QwenMathPRMFormat",
    "RLHFlowFormat",
    "Verifier",
    "VerifierConfig",
    "VerifierStats",
    "clean_steps",
    "format_name_for",
    "load_lv_threshold",
    "make_format",
]
