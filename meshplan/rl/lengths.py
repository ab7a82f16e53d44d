"""The responses' lengths between their mean and their maximum, as the rollout's decode time reads them.

A run states the longest response (verl data.max_response_length, SkyRL max_generate_length) and, where it knows it,
the mean. Given only those two on [0, max], the least-assuming shape is the one of maximum entropy with that mean: a
truncated exponential, density proportional to exp(-u x / max) with u solved from mean / max (u > 0 below half the
maximum, u < 0 above it, u = 0 uniform); it needs no fitted parameter, and as the mean reaches the maximum it
becomes every response at the maximum. Lengths are in units of the maximum here (x in [0, 1]).
"""

from __future__ import annotations

import math
from functools import cache

_FLAT = 1e-6  # |u| below this: the uniform shape (the closed forms lose their digits there)
_SERIES = 1e-2  # |u| below this: the survival and second moment by their series (the closed forms cancel there)


def _mean_of(u: float) -> float:
    """The shape's mean over [0, 1] at rate u: 1/u - 1/(e^u - 1)."""
    if abs(u) < _FLAT:
        return 0.5 - u / 12
    if u > 0:
        return 1 / u - math.exp(-u) / -math.expm1(-u)
    return 1 / u - 1 / math.expm1(u)


@cache
def rate(share: float) -> float:
    """The rate u whose truncated exponential on [0, 1] has mean `share` (0 < share < 1), by bisection (the mean
    falls as u grows)."""
    lo, hi = -2 / (1 - share) - 1, 2 / share + 1
    for _ in range(100):
        mid = (lo + hi) / 2
        if _mean_of(mid) > share:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def survival(u: float, x: float) -> float:
    """The share of responses longer than x (of the maximum): P(L > x)."""
    if abs(u) < _FLAT:
        return 1 - x
    if u > 0:
        return (math.exp(-u * x) - math.exp(-u)) / -math.expm1(-u)
    return math.expm1(u * (1 - x)) / math.expm1(u)


def quantile(u: float, r: float) -> float:
    """The length (of the maximum) that a share r of the responses ends by: P(L <= x) = r."""
    if r <= 0:
        return 0.0
    if abs(u) < _FLAT:
        return r
    if u > 0:  # e^-ux = (1 - r)(1 - e^-u) + e^-u
        return -math.log((1 - r) * -math.expm1(-u) + math.exp(-u)) / u
    return 1 - math.log1p((1 - r) * math.expm1(u)) / u


def survival_mean(u: float, x0: float, x1: float) -> float:
    """The share of responses still decoding, averaged over [x0, x1] of the maximum: the mean of P(L > x) there."""
    width = x1 - x0
    if abs(u) < _SERIES:  # (1 - x)(1 - u x / 2) to first order: the closed form cancels to u^2 here
        linear = width - (x1 * x1 - x0 * x0) / 2
        bent = (x1 * x1 - x0 * x0) / 2 - (x1 ** 3 - x0 ** 3) / 3
        return (linear - u / 2 * bent) / width
    if u > 0:  # (e^-ux - e^-u) / (1 - e^-u)
        area = (math.exp(-u * x0) - math.exp(-u * x1)) / u - width * math.exp(-u)
        return area / -math.expm1(-u) / width
    # (e^u(1-x) - 1) / (e^u - 1): the same, written so that e^-ux cannot overflow
    area = (math.exp(u * (1 - x0)) - math.exp(u * (1 - x1))) / u - width
    return area / math.expm1(u) / width


def second_moment(u: float) -> float:
    """E[X^2] of the shape at rate u, in units of the maximum squared."""
    if abs(u) < _SERIES:  # the closed form cancels to u^3 / 3 here: its series
        return 1 / 3 - u / 12 + u * u / 360
    if u > 0:  # E[X^2] = (2 - e^-u (u^2 + 2u + 2)) / (u^2 (1 - e^-u))
        return (2 - math.exp(-u) * (u * u + 2 * u + 2)) / (u * u * -math.expm1(-u))
    return (2 * math.exp(u) - (u * u + 2 * u + 2)) / (u * u * math.expm1(u))  # the same times e^u / e^u


def length_variance(mean: float, longest: float) -> float:
    """The variance of lengths on [0, longest] with that mean, tokens squared: the shape's at its rate; 0 where the
    mean is the longest (every length at it)."""
    if mean >= longest:
        return 0.0
    share = mean / longest
    return max(0.0, second_moment(rate(share)) - share * share) * longest * longest


def age_in_flight(u: float, share: float) -> float:
    """The mean tokens already decoded by a sequence in the batch while the queue keeps it full, in units of the
    maximum: each slot holds a response for as long as it decodes, so a slot's response is length-biased and its age
    uniform over its length: E[L^2] / (2 E[L])."""
    return second_moment(u) / (2 * share)


@cache
def drain_need(u: float, prompt: float) -> float:
    """The most tokens a response of the drain holds, counted over the responses still decoding, in units of the
    maximum: max over x of P(L > x) (prompt + x), `prompt` in units of the maximum too; the last responses start
    together, so at x they hold prompt + x each. P(L > x) and prompt + x are log-concave, so their product has one
    peak: a golden-section search finds it."""
    ratio = (math.sqrt(5) - 1) / 2
    lo, hi = 0.0, 1.0
    for _ in range(80):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if survival(u, a) * (prompt + a) >= survival(u, b) * (prompt + b):
            hi = b
        else:
            lo = a
    return max(prompt, survival(u, (lo + hi) / 2) * (prompt + (lo + hi) / 2))
