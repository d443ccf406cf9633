# NumPy reference of the relative_position_bias op (src/layers/attention/relative_position_bias.h), for
# tests/op_runner_numpy_test.py, which runs this file with its own names in scope (Case, randn, np, math, ...).
# The bucketing follows the published T5 description (Mesh TensorFlow's _relative_position_bucket, in terms of
# n = -(key position - query position)), with the log-spaced half in float32; the bias is a gather from the
# table and its vector-Jacobian product a scatter-add (np.add.at) into the table.


def t5_buckets(rel, bidirectional, num_buckets, max_distance):
    """rel = key position - query position (any integer array) -> bucket indices."""
    n = -np.asarray(rel, dtype=np.int64)
    ret = np.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int64) * num_buckets  # keys after the query get the upper half
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # float32 as T5 computes it; n = 0 only occurs where is_small, so its log is never used.
    ratio = np.maximum(n, 1).astype(np.float32) / np.float32(max_exact)
    scaled = np.log(ratio) / np.float32(math.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact)
    large = np.minimum(max_exact + scaled.astype(np.int64), num_buckets - 1)
    return ret + np.where(is_small, n, large)


def relative_position_bias_ref(xs, a):
    """table [NB, H] -> bias [1, H, T, S]; query i sits at key position i + S - T."""
    table = xs[0]
    T, S = a["T"], a["S"]
    rel = np.arange(S)[None, :] - (np.arange(T)[:, None] + S - T)
    buckets = t5_buckets(rel, a["bidirectional"], a["num_buckets"], a["max_distance"])   # [T, S]
    bias = table[buckets].transpose(2, 0, 1)[None]                                        # [1, H, T, S]

    def back(gs):
        dtable = np.zeros_like(table)
        np.add.at(dtable, buckets, gs[0][0].transpose(1, 2, 0))  # every (i, j) adds into its bucket's row
        return [dtable]

    return [bias], back


def _rpb(NB, H, attrs):
    return Case([randn(NB, H)], relative_position_bias_ref, attrs)


CASES = {
    "relative_position_bias": lambda: [
        # T5's defaults, distances beyond max_distance: encoder (bidirectional) and decoder (causal) bucketing.
        _rpb(32, 2, {"T": 150, "S": 150, "bidirectional": True, "num_buckets": 32, "max_distance": 128}),
        _rpb(32, 3, {"T": 140, "S": 140, "bidirectional": False, "num_buckets": 32, "max_distance": 128}),
        # Small odd sizes: queries at the end of the keys, exact, log-spaced and clamped buckets in both directions.
        _rpb(10, 3, {"T": 6, "S": 9, "bidirectional": True, "num_buckets": 10, "max_distance": 6}),
        _rpb(7, 2, {"T": 5, "S": 12, "bidirectional": False, "num_buckets": 7, "max_distance": 9}),
        # More queries than keys (cross-attention sizes), an odd bidirectional bucket count, one position.
        _rpb(9, 2, {"T": 7, "S": 3, "bidirectional": True, "num_buckets": 9, "max_distance": 5}),
        _rpb(4, 1, {"T": 1, "S": 1, "bidirectional": True, "num_buckets": 4, "max_distance": 2}),
        # Distance 10 with max_exact 5, max_distance 160: log(2) / log(32) * 5 is 1 in the reals, 1.0 in float32
        # and 0.99999999999999989 in float64, so only float32 arithmetic gives T5's bucket.
        _rpb(10, 2, {"T": 12, "S": 12, "bidirectional": False, "num_buckets": 10, "max_distance": 160}),
        _rpb(20, 2, {"T": 12, "S": 12, "bidirectional": True, "num_buckets": 20, "max_distance": 160}),
    ],
}
