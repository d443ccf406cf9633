# NumPy references of linear_attention and performer_features (src/layers/linear/linear_attention.h), for
# tests/op_runner_numpy_test.py, which runs this file with its own names in scope (Case, randn, rng,
# positive, np, ...). The forward is the recurrence token by token; the vector-Jacobian product is a
# reverse loop over time written out by hand (not derived from the C++ kernels).


def _phi(x, name):
    if name in ("elu_plus_one", "elu+1"):
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0))), np.where(x > 0, 1.0, np.exp(np.minimum(x, 0.0)))
    if name == "relu":
        return np.maximum(x, 0.0), (x > 0).astype(float)
    return x.copy(), np.ones_like(x)


def linear_attention_ref(xs, a):
    q, k, v, s0, z0 = xs
    B, T, H, dk = q.shape
    dv = v.shape[3]
    fq, dfq_dq = _phi(q, a["feature_map"])
    fk, dfk_dk = _phi(k, a["feature_map"])
    norm, eps, causal = a["normalize"], a["eps"], a["form"] != "noncausal"
    S0 = s0 if s0 is not None else np.zeros((B, H, dk, dv))
    Z0 = z0 if z0 is not None else np.zeros((B, H, dk))
    o = np.zeros((B, T, H, dv))
    states, norms = [], []   # per t, the (S, z) that query t reads
    S, z = S0.copy(), Z0.copy()
    if not causal:
        for t in range(T):
            S = S + np.einsum("bhi,bhj->bhij", fk[:, t], v[:, t])
            z = z + fk[:, t]
    for t in range(T):
        if causal:
            S = S + np.einsum("bhi,bhj->bhij", fk[:, t], v[:, t])
            z = z + fk[:, t]
        states.append(S)
        norms.append(z)
        num = np.einsum("bhi,bhij->bhj", fq[:, t], S)
        den = np.einsum("bhi,bhi->bh", fq[:, t], z) + eps
        o[:, t] = num / den[..., None] if norm else num
    ST, zT = S, z

    def back(gs):
        go = gs[0] if gs[0] is not None else np.zeros_like(o)
        G = (gs[1] if gs[1] is not None else np.zeros_like(ST)).copy()   # dL/dS_t, walking back
        gz = (gs[2] if gs[2] is not None else np.zeros_like(zT)).copy()
        dfq, dfk, dv_ = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        # Per query t: u = dL/dnum, dd = dL/dden.
        us, dds = [], []
        for t in range(T):
            S_t, z_t = states[t], norms[t]
            num = np.einsum("bhi,bhij->bhj", fq[:, t], S_t)
            den = np.einsum("bhi,bhi->bh", fq[:, t], z_t) + eps
            if norm:
                u = go[:, t] / den[..., None]
                dd = -np.einsum("bhj,bhj->bh", go[:, t], num) / den**2
            else:
                u, dd = go[:, t], np.zeros((B, H))
            dfq[:, t] = np.einsum("bhij,bhj->bhi", S_t, u) + dd[..., None] * z_t
            us.append(u)
            dds.append(dd)
        if not causal:   # every query read S_T, z_T
            for t in range(T):
                G = G + np.einsum("bhi,bhj->bhij", fq[:, t], us[t])
                gz = gz + dds[t][..., None] * fq[:, t]
        for t in reversed(range(T)):
            if causal:
                G = G + np.einsum("bhi,bhj->bhij", fq[:, t], us[t])
                gz = gz + dds[t][..., None] * fq[:, t]
            dfk[:, t] = np.einsum("bhij,bhj->bhi", G, v[:, t]) + gz
            dv_[:, t] = np.einsum("bhi,bhij->bhj", fk[:, t], G)
        return [dfq * dfq_dq, dfk * dfk_dk, dv_, G if s0 is not None else None, gz if z0 is not None else None]

    return [o, ST, zT], back


def performer_ref(xs, a):
    x, w = xs
    m = w.shape[0]
    p = np.einsum("bthd,md->bthm", x, w)
    shift = 0.5 * (x * x).sum(-1, keepdims=True)
    arg = p.argmax(-1)
    if a["stabilize"]:
        shift = shift + p.max(-1, keepdims=True)
    y = np.exp(p - shift) / np.sqrt(m)

    def back(gs):
        e = gs[0] * y                               # dL/d(exponent), per feature
        tot = e.sum(-1, keepdims=True)
        dx = np.einsum("bthm,md->bthd", e, w) - tot * x
        dw = np.einsum("bthm,bthd->md", e, x)
        if a["stabilize"]:
            dx = dx - tot * w[arg]
            for idx in np.ndindex(*arg.shape):
                dw[arg[idx]] -= tot[idx][0] * x[idx]
        return [dx, dw]

    return [y], back


def _la_case(B, T, H, dk, dv, attrs, state=True, positive_qk=False):
    make = (lambda *s: rng.uniform(0.2, 1.5, size=s)) if positive_qk else randn
    q, k, v = make(B, T, H, dk), make(B, T, H, dk), randn(B, T, H, dv)
    s0 = randn(B, H, dk, dv) if state else None
    z0 = rng.uniform(0.5, 1.5, size=(B, H, dk)) if state else None
    return Case([q, k, v, s0, z0], linear_attention_ref, attrs)


CASES = {
    "linear_attention": lambda: [
        _la_case(2, 7, 2, 3, 4, {"form": "chunkwise", "chunk": 3}),
        _la_case(1, 5, 2, 4, 3, {"form": "recurrent", "feature_map": "elu_plus_one"}, state=False),
        _la_case(2, 6, 1, 3, 2, {"form": "noncausal", "normalize": True}),
        _la_case(1, 4, 2, 3, 5, {"form": "chunkwise", "chunk": 2, "feature_map": "identity", "normalize": False}),
        _la_case(2, 5, 2, 3, 3, {"form": "chunkwise", "chunk": 4, "feature_map": "identity"}, positive_qk=True),
        _la_case(1, 6, 1, 2, 3, {"form": "recurrent", "feature_map": "relu", "eps": 1e-3}, positive_qk=True),
        _la_case(1, 1, 3, 3, 2, {"form": "recurrent"}),
    ],
    "performer_features": lambda: [
        Case([0.5 * randn(2, 3, 2, 4), randn(5, 4)], performer_ref, {"stabilize": True}),
        Case([0.5 * randn(1, 4, 1, 3), randn(7, 3)], performer_ref, {"stabilize": False}),
    ],
}
