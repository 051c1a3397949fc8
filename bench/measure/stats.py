"""Statistics derived from raw timing samples (milliseconds)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

NOISY_IQR_RATIO = 0.10  # IQR / median above this marks a measurement as noisy


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, torch.quantile's too)."""
    if not sorted_xs:
        raise ValueError("quantile of no samples")
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Stats:
    count: int
    median: float
    q1: float
    q3: float
    iqr: float
    min: float
    max: float
    mean: float
    std: float

    @classmethod
    def of(cls, samples) -> Stats:
        xs = sorted(float(x) for x in samples)
        n = len(xs)
        if n == 0:
            raise ValueError("no samples")
        mean = sum(xs) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
        q1, q3 = quantile(xs, 0.25), quantile(xs, 0.75)
        return cls(count=n, median=quantile(xs, 0.5), q1=q1, q3=q3, iqr=q3 - q1, min=xs[0],
                   max=xs[-1], mean=mean, std=std)

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.median > 0 else float("inf")

    @property
    def noisy(self) -> bool:
        return self.rel_iqr > NOISY_IQR_RATIO

    def to_dict(self) -> dict:
        return asdict(self) | {"rel_iqr": self.rel_iqr, "noisy": self.noisy}
