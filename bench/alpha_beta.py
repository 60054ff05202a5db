"""The alpha-beta model of one all-reduce, t(n) = alpha + beta * n, and its
fit to measured times: what bench/report.py fits to loopback
(bench_allreduce) and bench/link_bench.py to a shaped link. A module of its
own so that neither of the two imports the other for it.
"""


# Where each term of the model is read off: alpha from the sizes up to 4 KiB
# (the bytes cost nothing measurable there), beta from 1 MiB up (the bytes
# dominate). A least-squares fit over all sizes would let the few sizes with
# an odd cost (Gloo's 4-byte all-reduce, one float, skips work and is several
# times faster than its 16-byte one) pull alpha around. The median over the
# small sizes keeps that one size from moving alpha much.
LATENCY_BOUND = 4 << 10
BANDWIDTH_BOUND = 1 << 20


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def fit_alpha_beta(sizes, seconds):
    """(alpha s, beta s/B) of t(n) = alpha + beta*n, or None when the sizes
    do not allow it (fewer than two on either side, or a beta that is not
    positive: a filtered run, or one too noisy to read).

    alpha: the median time of the all-reduces of at most LATENCY_BOUND
    bytes; beta: the median of (t - alpha) / n over those of at least
    BANDWIDTH_BOUND bytes.
    """
    small = [t for n, t in zip(sizes, seconds) if n <= LATENCY_BOUND]
    large = [(n, t) for n, t in zip(sizes, seconds) if n >= BANDWIDTH_BOUND]
    if len(small) < 2 or len(large) < 2:
        return None
    alpha = median(small)
    beta = median([(t - alpha) / n for n, t in large])
    return (alpha, beta) if beta > 0 else None
