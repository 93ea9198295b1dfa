"""The fixed probability scale every coloured view uses (terminal and HTML alike).

Okabe-Ito colours: distinguishable with the common colour-vision deficiencies and readable on
dark and light backgrounds; the likeliest band keeps the terminal's own colour so surprises stand out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Band:
    low: float  # inclusive lower bound of the probability
    label: str
    style: str  # rich style
    hex: str  # for HTML


BANDS = (
    Band(0.9, ">90%", "", "inherit"),
    Band(0.6, "60-90%", "#009e73", "#009e73"),
    Band(0.3, "30-60%", "#56b4e9", "#56b4e9"),
    Band(0.1, "10-30%", "#e69f00", "#e69f00"),
    Band(0.0, "<10%", "bold #d55e00", "#d55e00"),
)


def band_for(prob: float) -> Band:
    for band in BANDS:
        if prob >= band.low:
            return band
    return BANDS[-1]
