# NumPy reference of the attention op (src/layers/attention/attention.h), for tests/op_runner_numpy_test.py,
# which runs this file with its own names in scope (Case, randn, rng, np, math, ...). The forward materialises
# the [B, H, T, S] scores with the visibility mask (causal limit, query and key padding) and the bias; a row
# that sees no key gives o = 0 and lse = -inf, and its cotangents are ignored. The vector-Jacobian product is
# the softmax backward written out by hand.


def visibility(B, T, S, q_len, k_len, causal):
    """[B, 1, T, S] booleans: query i of row b sees key j."""
    ql = np.asarray(q_len, dtype=np.int64) if q_len is not None else np.full(B, T)
    kl = np.asarray(k_len, dtype=np.int64) if k_len is not None else np.full(B, S)
    i, j = np.arange(T)[None, :, None], np.arange(S)[None, None, :]
    seen = (i < ql[:, None, None]) & (j < kl[:, None, None])
    if causal:
        seen = seen & (j <= i + S - T)  # query i at key position i + S - T
    return seen[:, None]


def attention_ref(xs, a):
    """q [B,T,H,Dk], k [B,S,Hk,Dk], v [B,S,Hk,Dv], q_lengths/k_lengths [B], bias [1 or B,H,T,S]."""
    q, k, v, q_len, k_len, bias = xs
    B, T, H, Dk = q.shape
    S, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    c = a["scale"] if a["scale"] > 0 else 1.0 / math.sqrt(Dk)
    seen = visibility(B, T, S, q_len, k_len, a["causal"])         # [B,1,T,S]
    live = seen.any(axis=-1, keepdims=True)                        # [B,1,T,1]: the row sees some key
    qh = q.transpose(0, 2, 1, 3)                                   # [B,H,T,Dk]
    kh = np.repeat(k.transpose(0, 2, 1, 3), g, axis=1)             # [B,H,S,Dk]
    vh = np.repeat(v.transpose(0, 2, 1, 3), g, axis=1)             # [B,H,S,Dv]
    s = c * qh @ kh.swapaxes(-1, -2) + (bias if bias is not None else 0.0)
    s = np.where(seen, s, -np.inf)
    m = np.where(live, s.max(axis=-1, keepdims=True), 0.0)        # a dead row's max would be -inf
    e = np.where(seen, np.exp(s - m), 0.0)
    ell = np.where(live, e.sum(axis=-1, keepdims=True), 1.0)
    p = e / ell                                                    # 0 in dead rows
    lse = np.where(live, m + np.log(ell), -np.inf)
    o = p @ vh

    def back(gs):
        go = gs[0].transpose(0, 2, 1, 3) if gs[0] is not None else np.zeros_like(o)
        gl = gs[1].transpose(0, 2, 1)[..., None] if gs[1] is not None else np.zeros(lse.shape)
        go, gl = np.where(live, go, 0.0), np.where(live, gl, 0.0)  # a dead row's cotangents are ignored
        dp = go @ vh.swapaxes(-1, -2)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True) + gl)  # d lse / d s = p
        dq = c * ds @ kh
        dk = c * ds.swapaxes(-1, -2) @ qh
        dv = p.swapaxes(-1, -2) @ go
        fold = lambda x: x.reshape(B, Hk, g, S, -1).sum(axis=2).transpose(0, 2, 1, 3)
        dbias = None if bias is None else ds.sum(axis=0, keepdims=True) if bias.shape[0] == 1 else ds
        return [dq.transpose(0, 2, 1, 3), fold(dk), fold(dv), None, None, dbias]

    return [o.transpose(0, 2, 1, 3), lse[..., 0].transpose(0, 2, 1)], back


def _lengths(values, dtype=np.int64):
    return np.array(values, dtype=dtype)


def _qkv(B, T, S, H, Hk, Dk, Dv):
    return [randn(B, T, H, Dk), randn(B, S, Hk, Dk), randn(B, S, Hk, Dv)]


CASES = {
    "attention": lambda: [
        # Plain: causal GQA with T, S not multiples of the block; cross attention T > S; decoding (T = 1).
        Case(_qkv(2, 5, 7, 4, 2, 3, 4) + [None, None, None], attention_ref, {"causal": True, "block": 2}),
        Case(_qkv(2, 6, 4, 3, 1, 4, 2) + [None, None, None], attention_ref, {"causal": False, "scale": 0.7, "block": 3}),
        Case(_qkv(1, 1, 9, 2, 2, 5, 5) + [None, None, None], attention_ref, {"causal": True, "block": 4}),
        # BERT: bidirectional, padded batch (a full row, a short one, an empty one), a bias per batch row.
        Case(_qkv(3, 6, 6, 2, 2, 3, 4) + [_lengths([6, 3, 0]), _lengths([6, 3, 0]), randn(3, 2, 6, 6)],
             attention_ref, {"causal": False, "block": 4}),
        # T5 cross attention: T != S, padded queries and memory (i32 lengths), GQA, Dk != Dv, a shared bias.
        Case(_qkv(2, 5, 7, 4, 2, 3, 2) + [_lengths([5, 2], np.int32), _lengths([7, 1], np.int32), randn(1, 4, 5, 7)],
             attention_ref, {"causal": False, "block": 2}),
        # T5 decoder self-attention: causal with padding and a shared bias.
        Case(_qkv(2, 7, 7, 2, 1, 4, 3) + [_lengths([7, 4]), _lengths([7, 4]), randn(1, 2, 7, 7)],
             attention_ref, {"causal": True, "block": 3}),
        # Causal queries at the end of a longer, padded cache; only key lengths.
        Case(_qkv(2, 3, 8, 2, 2, 3, 3) + [None, _lengths([8, 6]), None], attention_ref, {"causal": True, "block": 4}),
        # One query against no keys in one row: o = 0, lse = -inf; only query lengths in the other.
        Case(_qkv(2, 1, 4, 2, 1, 3, 3) + [None, _lengths([0, 3]), randn(2, 2, 1, 4)], attention_ref,
             {"causal": False, "block": 2}),
        Case(_qkv(2, 4, 4, 2, 2, 3, 3) + [_lengths([1, 4], np.int32), None, None], attention_ref,
             {"causal": True, "block": 64}),
    ],
}
