"""What one-shot pruning aims at: the method and the sparsity or N:M pattern, checked."""

import dataclasses
import re

from maskfit import checks

__all__ = ["METHODS", "Target", "target"]

METHODS = ("magnitude", "wanda", "sparsegpt")
"""`prune_oneshot`'s methods, from the one that looks at least to the one that looks most."""

_PATTERN = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class Target:
    """A checked request: `method`, and either `sparsity` or `n` of every `m` pruned."""

    method: str
    sparsity: float
    n: int = 0
    m: int = 0

    @property
    def pattern(self):
        """`"n:m"`, or None for unstructured sparsity."""
        return f"{self.n}:{self.m}" if self.m else None

    def describe(self):
        return self.pattern or f"{self.sparsity:.0%}"


def target(method, sparsity, pattern, blocksize):
    """The checked `Target` of `prune_oneshot`'s arguments; raises on bad ones."""
    if method not in METHODS:
        raise ValueError(
            f"prune_oneshot: unknown method, expected one of {METHODS}."
            f" Received: method={method!r}"
        )
    if not checks.is_integer(blocksize) or int(blocksize) < 1:
        raise ValueError(
            "prune_oneshot: blocksize must be a positive integer (SparseGPT's"
            f" column block, 128 in the paper). Received: blocksize={blocksize!r}"
        )
    if pattern is not None:
        if sparsity is not None:
            raise ValueError(
                "prune_oneshot takes sparsity= or pattern=, not both: an N:M"
                " pattern fixes the sparsity at N/M. Received:"
                f" sparsity={sparsity!r}, pattern={pattern!r}"
            )
        found = _PATTERN.match(pattern) if isinstance(pattern, str) else None
        n, m = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
        if not found or not 0 < n < m:
            raise ValueError(
                "prune_oneshot: pattern must be a string 'N:M' with 0 < N < M, N"
                f" entries pruned of every M (e.g. '2:4'). Received: pattern={pattern!r}"
            )
        if int(blocksize) % m:
            raise ValueError(
                f"prune_oneshot: SparseGPT's column blocks ({blocksize}) must hold"
                f" whole groups of M={m} columns. Pass a blocksize divisible by {m}."
            )
        return Target(method, n / m, n, m)
    if sparsity is None:
        raise ValueError(
            "prune_oneshot needs sparsity= (a fraction in (0, 1)) or pattern="
            " ('N:M'). Received neither."
        )
    if not checks.is_real(sparsity) or not 0.0 < float(sparsity) < 1.0:
        raise ValueError(
            "prune_oneshot: sparsity must be a fraction strictly between 0 and 1,"
            f" the share of each layer's kernel set to 0. Received: sparsity={sparsity!r}"
        )
    return Target(method, float(sparsity))
