"""The reference limit in benchmarks/ (hand-derived PPO gradients) agrees with autograd, so the
benchmark that compares daskrl's general path against it compares the same maths."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HAND = Path(__file__).resolve().parents[1] / "benchmarks" / "hand_kernel.py"


def test_the_hand_kernel_matches_autograd():
    spec = importlib.util.spec_from_file_location("hand_kernel", HAND)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_hand_kernel_matches_autograd()
