"""Reading a sweep: where runtime leaves its flat region. Pure functions over plain lists, no torch."""


def runtime_knee(xs, times, factor=1.3):
    """The first x whose runtime exceeds `factor` x the flat region's (the fastest time seen so far).

    None when the runtime never leaves the flat region. The running minimum keeps one slow, noisy early
    point from hiding the knee.
    """
    if len(xs) != len(times):
        raise ValueError("xs and times differ in length")
    flat = None
    for x, t in zip(xs, times):
        if t is None:
            continue
        if flat is not None and t > factor * flat:
            return x
        flat = t if flat is None else min(flat, t)
    return None


def approach_knee(xs, rates, ceiling, fraction=0.5):
    """The first x whose achieved rate reaches `fraction` of `ceiling` (None if none, or no ceiling)."""
    if not ceiling:
        return None
    for x, rate in zip(xs, rates):
        if rate is not None and rate >= fraction * ceiling:
            return x
    return None


def scaling_ratios(times):
    """t[i+1] / t[i] for consecutive doublings."""
    return [b / a for a, b in zip(times, times[1:])]


def grows_in_proportion(times, ratio=1.8, consecutive=2):
    """True when the last `consecutive` doublings each grew runtime by at least `ratio`: stop the sweep."""
    ratios = scaling_ratios(times)
    return len(ratios) >= consecutive and all(r >= ratio for r in ratios[-consecutive:])


def overhead_bound_batch(batches, times, flat_factor=1.3, proportional=1.8):
    """The largest batch before the step time first exceeds `flat_factor` x the fastest time so far.

    At and below it, runtime is roughly flat: fixed per-step cost (overhead), not work, sets the time.
    None when the first two doublings each grow runtime in proportion (never overhead-bound); one noisy
    doubling is not enough to say so. When the whole sweep stays flat, the last batch is returned.
    """
    if len(batches) != len(times) or not times:
        raise ValueError("need one time per batch")
    if grows_in_proportion(times[:3], proportional):
        return None
    knee = runtime_knee(batches, times, flat_factor)
    if knee is None:
        return batches[-1]
    return batches[batches.index(knee) - 1]
