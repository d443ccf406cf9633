#!/usr/bin/env python3
"""Every op that `seqlab op --list` names, run through `seqlab op` on .npy files and compared with an
independent NumPy implementation of its forward and of its vector-Jacobian product (written by hand
here, not derived from the C++). Usage: op_runner_numpy_test.py /path/to/seqlab

Inputs are f64 at small odd shapes, with broadcasting for binary ops, values away from kinks and ties,
positive where the domain needs it, in-range indices with repeats, and 0/1 masks. Outputs and
gradients must match to 1e-10 relative to max(1, |reference|), infinities exactly (attention's lse is -inf
in a row that sees no key), and a NaN never matches. An op without a reference fails.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print(f"op_runner_numpy_test: numpy is not installed for {sys.executable}; install it (pip install numpy)")
    sys.exit(1)

TOL = 1e-10
rng = np.random.default_rng(20240520)


# ---- input makers ----
def randn(*shape):
    return rng.standard_normal(shape)


def away_from_zero(*shape):  # |x| in [0.2, 2.2): away from the kinks of relu and elu at 0
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.2, 2.2, size=shape)


def positive(*shape):
    return rng.uniform(0.3, 2.0, size=shape)


def distinct(*shape):  # a shuffled ramp: no two values within 0.1, so max has no near ties
    return rng.permutation(0.1 * np.arange(math.prod(shape)) - 3.0).reshape(shape)


def mask(*shape):
    return (rng.uniform(size=shape) < 0.5).astype(np.int64)


def unbroadcast(g, shape):
    """Sums g over the dimensions that broadcasting added or stretched, back to `shape`."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1), keepdims=True)


class Case:
    """One run of an op: inputs in the op's order (None: an absent optional input), attrs chosen
    here, and a reference ref(inputs, attrs) -> (outputs, vjp) where vjp(cotangents) gives one
    gradient per input (None for non-floating or absent ones); a cotangent is None where its output
    gets no grad file. `check` replaces the comparison for ops NumPy cannot replay."""

    def __init__(self, inputs, ref, attrs=None, cotangents=None, check=None):
        self.inputs, self.ref, self.attrs, self.check = inputs, ref, attrs or {}, check
        self.cotangents = cotangents  # which outputs get a cotangent file (default: all)


# ---- elementwise ----
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


GELU_C, GELU_A = math.sqrt(2.0 / math.pi), 0.044715


def gelu_grad(x):
    t = np.tanh(GELU_C * (x + GELU_A * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)


# name → (f(x, attrs), f'(x, attrs), input maker)
UNARY = {
    "neg": (lambda x, a: -x, lambda x, a: -np.ones_like(x), away_from_zero),
    "exp": (lambda x, a: np.exp(x), lambda x, a: np.exp(x), away_from_zero),
    "log": (lambda x, a: np.log(x), lambda x, a: 1.0 / x, positive),
    "sqrt": (lambda x, a: np.sqrt(x), lambda x, a: 0.5 / np.sqrt(x), positive),
    "rsqrt": (lambda x, a: x**-0.5, lambda x, a: -0.5 * x**-1.5, positive),
    "square": (lambda x, a: x * x, lambda x, a: 2.0 * x, away_from_zero),
    "tanh": (lambda x, a: np.tanh(x), lambda x, a: 1.0 / np.cosh(x) ** 2, away_from_zero),
    "sigmoid": (lambda x, a: sigmoid(x), lambda x, a: sigmoid(x) * sigmoid(-x), away_from_zero),
    "silu": (lambda x, a: x * sigmoid(x), lambda x, a: sigmoid(x) * (1.0 + x * sigmoid(-x)), away_from_zero),
    "gelu": (lambda x, a: 0.5 * x * (1.0 + np.tanh(GELU_C * (x + GELU_A * x**3))), lambda x, a: gelu_grad(x), away_from_zero),
    "relu": (lambda x, a: np.maximum(x, 0.0), lambda x, a: (x > 0).astype(float), away_from_zero),
    "elu": (lambda x, a: np.where(x > 0, x, a["alpha"] * np.expm1(x)),
            lambda x, a: np.where(x > 0, 1.0, a["alpha"] * np.exp(x)), away_from_zero),
    "softplus": (lambda x, a: np.logaddexp(0.0, x), lambda x, a: sigmoid(x), away_from_zero),
    # scalar ops: the scalar is attribute s
    "add_scalar": (lambda x, a: x + a["s"], lambda x, a: np.ones_like(x), randn),
    "mul_scalar": (lambda x, a: x * a["s"], lambda x, a: np.full_like(x, a["s"]), randn),
    "pow": (lambda x, a: x ** a["s"], lambda x, a: a["s"] * x ** (a["s"] - 1.0), positive),
    "rsub": (lambda x, a: a["s"] - x, lambda x, a: -np.ones_like(x), randn),
    "rdiv": (lambda x, a: a["s"] / x, lambda x, a: -a["s"] / (x * x), positive),
}
SCALAR_ATTRS = {"add_scalar": 1.5, "mul_scalar": -0.75, "pow": 2.5, "rsub": 3.0, "rdiv": 2.0}


def unary_cases(name):
    f, df, make = UNARY[name]
    attrs = {"alpha": 0.7} if name == "elu" else {"s": SCALAR_ATTRS[name]} if name in SCALAR_ATTRS else {}
    ref = lambda xs, a: ([f(xs[0], a)], lambda gs: [gs[0] * df(xs[0], a)])
    return [Case([make(3, 5)], ref, attrs), Case([make(2, 3, 7)], ref, attrs)]


# name → (f(a, b), (df/da, df/db) as functions of a, b, g)
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b, g: (g, g)),
    "sub": (lambda a, b: a - b, lambda a, b, g: (g, -g)),
    "mul": (lambda a, b: a * b, lambda a, b, g: (g * b, g * a)),
    "div": (lambda a, b: a / b, lambda a, b, g: (g / b, -g * a / (b * b))),
}


def binary_cases(name):
    f, vjp = BINARY[name]

    def ref(xs, a):
        def back(gs):
            ga, gb = vjp(xs[0], xs[1], gs[0])
            return [unbroadcast(ga, xs[0].shape), unbroadcast(gb, xs[1].shape)]

        return [f(xs[0], xs[1])], back

    b = positive if name == "div" else randn
    # [3, 1, 5] with [4, 5]: both broadcast; [2, 3] with a 0-d array.
    return [Case([randn(3, 1, 5), b(4, 5)], ref), Case([randn(2, 3), b()], ref)]


def where_ref(xs, a):
    c = xs[0] != 0
    return [np.where(c, xs[1], xs[2])], lambda gs: [
        None, unbroadcast(np.where(c, gs[0], 0.0), xs[1].shape), unbroadcast(np.where(c, 0.0, gs[0]), xs[2].shape)]


def masked_fill_ref(xs, a):
    m = np.broadcast_to(xs[1] != 0, xs[0].shape)
    return [np.where(m, a["value"], xs[0])], lambda gs: [np.where(m, 0.0, gs[0]), None]


def matmul_ref(xs, a):
    A, B = xs
    return [A @ B], lambda gs: [unbroadcast(gs[0] @ np.swapaxes(B, -1, -2), A.shape),
                                unbroadcast(np.swapaxes(A, -1, -2) @ gs[0], B.shape)]


def linear_ref(xs, a):
    x, w, b = xs
    y = x @ w.T + (b if b is not None else 0.0)

    def back(gs):
        g = gs[0]
        rows_g, rows_x = g.reshape(-1, w.shape[0]), x.reshape(-1, w.shape[1])
        return [g @ w, rows_g.T @ rows_x, rows_g.sum(axis=0) if b is not None else None]
    return [y], back


def linear_gelu_ref(xs, a):
    (pre,), linear_back = linear_ref(xs, a)
    y = 0.5 * pre * (1.0 + np.tanh(GELU_C * (pre + GELU_A * pre**3)))
    return [y], lambda gs: linear_back([gs[0] * gelu_grad(pre)])


# ---- reductions ----
def reduce_axes(x, a):
    return tuple(d % x.ndim for d in a["dims"]) if a["dims"] else tuple(range(x.ndim))


def reduce_ref(kind):
    def ref(xs, a):
        x = xs[0]
        axes = reduce_axes(x, a)
        count = math.prod(x.shape[d] for d in axes)
        if kind == "max":
            yk = x.max(axis=axes, keepdims=True)
        else:
            yk = x.sum(axis=axes, keepdims=True) / (count if kind == "mean" else 1)
        y = yk if a["keepdim"] else yk.reshape([n for d, n in enumerate(x.shape) if d not in axes])

        def back(gs):
            gk = gs[0].reshape(yk.shape)
            if kind == "max":
                return [np.where(x == yk, gk, 0.0)]  # values are distinct: one winner per block
            return [np.broadcast_to(gk / (count if kind == "mean" else 1), x.shape)]

        return [y], back

    return ref


def reduce_cases(kind):
    make = distinct if kind == "max" else randn
    ref = reduce_ref(kind)
    return [Case([make(3, 4, 5)], ref, {"dims": [0, 2], "keepdim": False}),
            Case([make(3, 4, 5)], ref, {"dims": [1], "keepdim": True}),
            Case([make(2, 3)], ref, {"dims": [], "keepdim": False})]


def cumsum_ref(xs, a):
    d = a["dim"]
    return [np.cumsum(xs[0], axis=d)], lambda gs: [np.flip(np.cumsum(np.flip(gs[0], d), axis=d), d)]


# ---- views ----
def reshape_ref(xs, a):
    return [xs[0].reshape(a["shape"])], lambda gs: [gs[0].reshape(xs[0].shape)]


def permute_ref(xs, a):
    return [np.transpose(xs[0], a["dims"])], lambda gs: [np.transpose(gs[0], np.argsort(a["dims"]))]


def transpose_ref(xs, a):
    return [np.swapaxes(xs[0], a["dim0"], a["dim1"])], lambda gs: [np.swapaxes(gs[0], a["dim0"], a["dim1"])]


def narrow_ref(xs, a):
    x, d = xs[0], a["dim"]
    index = [slice(None)] * x.ndim
    index[d] = slice(a["start"], a["start"] + a["length"])
    index = tuple(index)

    def back(gs):
        gx = np.zeros_like(x)
        gx[index] = gs[0]
        return [gx]

    return [x[index]], back


def expand_ref(xs, a):
    return [np.broadcast_to(xs[0], a["shape"])], lambda gs: [unbroadcast(gs[0], xs[0].shape)]


# ---- softmax and losses ----
def softmax_ref(xs, a):
    d = a.get("dim", -1)
    e = np.exp(xs[0] - xs[0].max(axis=d, keepdims=True))
    y = e / e.sum(axis=d, keepdims=True)
    return [y], lambda gs: [y * (gs[0] - (gs[0] * y).sum(axis=d, keepdims=True))]


def log_softmax_ref(xs, a):
    d = a.get("dim", -1)
    z = xs[0] - xs[0].max(axis=d, keepdims=True)
    y = z - np.log(np.exp(z).sum(axis=d, keepdims=True))
    return [y], lambda gs: [gs[0] - np.exp(y) * gs[0].sum(axis=d, keepdims=True)]


def cross_entropy_ref(xs, a):
    logits, t = xs[0], xs[1]
    w = xs[2] if len(xs) > 2 and xs[2] is not None else np.ones(t.shape)
    ignore = a.get("ignore_index", -100)
    valid = t != ignore
    safe = np.where(valid, t, 0)
    m = logits.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[..., 0]
    picked = np.take_along_axis(logits, safe[..., None], axis=-1)[..., 0]
    total = (w * valid).sum()
    losses = np.where(valid, lse - picked, 0.0)
    loss = (w * losses).sum() / total
    onehot = np.eye(logits.shape[-1])[safe]
    dlogits = (np.exp(logits - lse[..., None]) - onehot) * (w * valid)[..., None] / total  # d loss / d logits
    dw = np.where(valid, losses - loss, 0.0) / total
    weighted = len(xs) > 2 and xs[2] is not None
    return [np.array(loss)], lambda gs: [gs[0] * dlogits, None] + ([gs[0] * dw] if weighted else [None])


def targets(shape, vocab, dtype, ignored):
    t = rng.integers(0, vocab, size=shape).astype(dtype)
    t.flat[0] = (ignored + 1) % vocab  # at least one target counts
    t.flat[1] = t.flat[0]  # a repeat
    t.flat[-1] = ignored
    return t


# ---- normalisation over the last dimension ----
def layer_norm_ref(xs, a):
    x, w, b = xs
    mu = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + a.get("eps", 1e-5))
    xhat = (x - mu) * rstd
    lead = tuple(range(x.ndim - 1))

    def back(gs):
        g = gs[0]
        gxhat = g * w
        gx = rstd * (gxhat - gxhat.mean(axis=-1, keepdims=True) - xhat * (gxhat * xhat).mean(axis=-1, keepdims=True))
        return [gx, (g * xhat).sum(axis=lead), g.sum(axis=lead) if b is not None else None]

    return [xhat * w + (b if b is not None else 0.0)], back


def rms_norm_ref(xs, a):
    x, w = xs
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + a.get("eps", 1e-6))

    def back(gs):
        gw_x = gs[0] * w
        gx = r * gw_x - x * r**3 * (gw_x * x).mean(axis=-1, keepdims=True)
        return [gx, (gs[0] * x * r).sum(axis=tuple(range(x.ndim - 1)))]

    return [x * r * w], back


# ---- indexing and structure ----
def embedding_ref(xs, a):
    w, idx = xs

    def back(gs):
        gw = np.zeros_like(w)
        np.add.at(gw, idx, gs[0])  # repeated indices accumulate
        return [gw, None]

    return [w[idx]], back


def dropout_check(xs, a, outs, grads, gs):
    """Dropout's mask comes from seqlab's generator: check only its shape of answer."""
    x, y, gx, g = xs[0], outs[0], grads[0], gs[0]
    p = a["p"]
    kept = y != 0
    if not 0.0 < kept.mean() < 1.0:
        return f"p={p} kept {kept.mean():.3f} of the elements"
    err_y = np.max(np.abs(y - np.where(kept, x / (1.0 - p), 0.0)))
    err_g = np.max(np.abs(gx - g * kept / (1.0 - p)))
    return max(err_y, err_g)


def concat_ref(xs, a):
    parts = [x for x in xs if x is not None]
    d = a["dim"]
    cuts = np.cumsum([p.shape[d] for p in parts])[:-1]
    absent = [None] * (len(xs) - len(parts))
    return [np.concatenate(parts, axis=d)], lambda gs: np.split(gs[0], cuts, axis=d) + absent


def stack_ref(xs, a):
    parts = [x for x in xs if x is not None]
    d = a["dim"]
    absent = [None] * (len(xs) - len(parts))
    return [np.stack(parts, axis=d)], lambda gs: [np.take(gs[0], i, axis=d) for i in range(len(parts))] + absent


def split_ref(xs, a):
    d = a["dim"]
    ys = np.split(xs[0], np.cumsum(a["sizes"])[:-1], axis=d)
    return ys, lambda gs: [np.concatenate([g if g is not None else np.zeros_like(y) for g, y in zip(gs, ys)], axis=d)]


def cases_for(name):
    """The cases of op `name`, or None when there is no reference."""
    if name in UNARY:
        return unary_cases(name)
    if name in BINARY:
        return binary_cases(name)
    if name in ("sum", "mean", "max"):
        return reduce_cases(name)
    table = {
        "where": lambda: [Case([mask(3, 5), randn(3, 5), randn(5)], where_ref)],
        "masked_fill": lambda: [Case([randn(2, 3, 5), mask(3, 5)], masked_fill_ref, {"value": -2.5})],
        "matmul": lambda: [Case([randn(2, 1, 3, 5), randn(3, 5, 4)], matmul_ref), Case([randn(3, 2, 5), randn(5, 4)], matmul_ref)],
        "linear": lambda: [Case([randn(2, 3, 5), randn(4, 5), randn(4)], linear_ref),
                           Case([randn(3, 5), randn(2, 5), None], linear_ref)],
        "linear_gelu": lambda: [Case([randn(2, 3, 5), randn(4, 5), randn(4)], linear_gelu_ref),
                                Case([randn(3, 5), randn(2, 5), None], linear_gelu_ref)],
        "cumsum": lambda: [Case([randn(3, 7, 2)], cumsum_ref, {"dim": 1}), Case([randn(5, 3)], cumsum_ref, {"dim": -1})],
        "reshape": lambda: [Case([randn(3, 4, 5)], reshape_ref, {"shape": [5, -1]})],
        "permute": lambda: [Case([randn(2, 3, 5)], permute_ref, {"dims": [2, 0, 1]})],
        "transpose": lambda: [Case([randn(2, 3, 5)], transpose_ref, {"dim0": 0, "dim1": 2}),
                              Case([randn(2, 3, 5)], transpose_ref, {"dim0": -2, "dim1": -1})],
        "narrow": lambda: [Case([randn(3, 7)], narrow_ref, {"dim": 1, "start": 2, "length": 4})],
        "expand": lambda: [Case([randn(3, 1)], expand_ref, {"shape": [2, 3, 5]})],
        "softmax": lambda: [Case([randn(3, 4, 5)], softmax_ref, {"dim": -1}), Case([randn(3, 4, 5)], softmax_ref, {"dim": 1})],
        "log_softmax": lambda: [Case([randn(3, 4, 5)], log_softmax_ref, {"dim": -1}),
                                Case([randn(3, 4, 5)], log_softmax_ref, {"dim": 1})],
        "cross_entropy": lambda: [
            Case([randn(2, 3, 7), targets((2, 3), 7, np.int64, -100), None], cross_entropy_ref, {"ignore_index": -100}),
            Case([randn(5, 4), targets((5,), 4, np.int32, 2), None], cross_entropy_ref, {"ignore_index": 2}),
            Case([randn(2, 3, 7), targets((2, 3), 7, np.int64, -100), rng.uniform(0.5, 2.0, size=(2, 3))],
                 cross_entropy_ref, {"ignore_index": -100})],
        "layer_norm": lambda: [Case([randn(2, 3, 5), randn(5), randn(5)], layer_norm_ref, {"eps": 1e-5}),
                               Case([randn(3, 7), randn(7), None], layer_norm_ref, {"eps": 1e-3})],
        "rms_norm": lambda: [Case([randn(2, 3, 5), randn(5)], rms_norm_ref, {"eps": 1e-6}),
                             Case([randn(3, 7), randn(7)], rms_norm_ref, {"eps": 1e-2})],
        "embedding": lambda: [Case([randn(7, 5), np.array([[1, 6, 1], [0, 3, 6]], dtype=np.int64)], embedding_ref),
                              Case([randn(4, 3), np.array([3, 3, 0, 2, 3], dtype=np.int32)], embedding_ref)],
        "dropout": lambda: [Case([away_from_zero(40, 50)], None, {"p": 0.3, "seed": 7, "training": True}, check=dropout_check)],
        "concat": lambda: [Case([randn(2, 3, 4), randn(2, 1, 4), randn(2, 2, 4)], concat_ref, {"dim": 1}),
                           Case([randn(2, 3), randn(2, 5), None], concat_ref, {"dim": -1})],
        "stack": lambda: [Case([randn(3, 4), randn(3, 4), randn(3, 4)], stack_ref, {"dim": 1}),
                          Case([randn(2, 5), randn(2, 5), None], stack_ref, {"dim": 0})],
        # y1 gets no cotangent: the runner must treat it as zeros.
        "split": lambda: [Case([randn(2, 6, 3)], split_ref, {"sizes": [2, 1, 3], "dim": 1}, cotangents=[0, 2])],
    }
    if name in table:
        return table[name]()
    return variant_cases()[name]() if name in variant_cases() else None


_variant_cases = None


def variant_cases():
    """The references of the variant ops, one file each in tests/numpy_refs/ (NAME.py defines CASES,
    a dict from op name to a function returning its cases). The files run with this module's names
    in scope (Case, randn, positive, rng, ...), so they need no imports of their own besides numpy."""
    global _variant_cases
    if _variant_cases is None:
        _variant_cases = {}
        folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "numpy_refs")
        for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if file.endswith(".py"):
                scope = dict(globals())
                with open(os.path.join(folder, file)) as f:
                    exec(compile(f.read(), os.path.join(folder, file), "exec"), scope)
                _variant_cases.update(scope["CASES"])
    return _variant_cases


# ---- running one case ----
def cli_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ",".join(str(int(e)) for e in v)
    return repr(v) if isinstance(v, float) else str(v)


def max_rel_error(got, ref):
    """Equal values (infinities too: attention's lse is -inf in a row that sees no key) count as exact; a NaN
    on either side, or an infinity the other side lacks, is an infinite error."""
    if got.shape != ref.shape:
        raise AssertionError(f"shape {got.shape} but NumPy gives {ref.shape}")
    if got.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        err = np.where(got == ref, 0.0, np.abs(got - ref) / np.maximum(1.0, np.abs(ref)))
    return float(np.max(np.where(np.isnan(err), np.inf, err)))


def run_case(binary, spec, case, workdir):
    """Runs one case; returns the worst relative error, or raises AssertionError with the reason."""
    names, outs = spec["inputs"], spec["outputs"]
    if len(case.inputs) != len(names):
        raise AssertionError(f"the reference has {len(case.inputs)} inputs, the op lists {names}")
    # Every attribute the op lists is passed explicitly: ours where we chose one, else its default.
    attrs = dict(spec["attrs"])
    attrs.update({k: v for k, v in case.attrs.items() if k in attrs})
    in_dir, out_dir = os.path.join(workdir, "in"), os.path.join(workdir, "out")
    os.makedirs(in_dir)
    for name, x in zip(names, case.inputs):
        if x is not None:
            np.save(os.path.join(in_dir, name + ".npy"), x)

    floating = [x is not None and x.dtype.kind == "f" for x in case.inputs]
    ref_y, vjp = case.ref(case.inputs, attrs) if case.ref else (None, None)
    if ref_y is not None and len(ref_y) != len(outs):
        raise AssertionError(f"the reference has {len(ref_y)} outputs, the op lists {outs}")
    shapes = [np.shape(y) for y in ref_y] if ref_y is not None else [case.inputs[0].shape] * len(outs)
    given = case.cotangents if case.cotangents is not None else range(len(outs))
    gs = [rng.standard_normal(shapes[o]) if o in given else None for o in range(len(outs))]
    for o, g in enumerate(gs):
        if g is not None:
            np.save(os.path.join(in_dir, f"grad_{outs[o]}.npy"), g)

    cmd = [binary, "op", spec["name"], "--in", in_dir, "--out", out_dir]
    for k, v in attrs.items():
        cmd += ["--attr", f"{k}={cli_value(v)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr.strip()}")

    got_y = [np.load(os.path.join(out_dir, o + ".npy")) for o in outs]
    got_g = [np.load(os.path.join(out_dir, f"grad_{n}.npy")) if f else None for n, f in zip(names, floating)]
    for arr in got_y + got_g:
        if arr is not None and arr.dtype != np.float64 and arr.dtype.kind == "f":
            raise AssertionError(f"an f64 run wrote {arr.dtype}")
    if case.check is not None:
        result = case.check(case.inputs, attrs, got_y, got_g, gs)
        if isinstance(result, str):
            raise AssertionError(result)
        return result
    ref_g = vjp(gs)
    worst = 0.0
    for o, (got, ref) in enumerate(zip(got_y, ref_y)):
        e = max_rel_error(got, np.asarray(ref, dtype=np.float64))
        if e > TOL:
            raise AssertionError(f"output {outs[o]} differs by {e:.3g}")
        worst = max(worst, e)
    for n, got, ref in zip(names, got_g, ref_g):
        if got is None:
            continue
        e = max_rel_error(got, np.asarray(ref, dtype=np.float64))
        if e > TOL:
            raise AssertionError(f"grad_{n} differs by {e:.3g}")
        worst = max(worst, e)
    return worst


def main():
    if len(sys.argv) != 2:
        print("usage: op_runner_numpy_test.py /path/to/seqlab")
        return 2
    binary = sys.argv[1]
    listing = subprocess.run([binary, "op", "--list"], capture_output=True, text=True, check=True).stdout
    specs = [json.loads(line) for line in listing.splitlines() if line.strip()]
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="op_runner_numpy_") as tmp:
        for spec in specs:
            name = spec["name"]
            cases = cases_for(name)
            if cases is None:
                print(f"FAIL {name}: no NumPy reference in {os.path.basename(__file__)}")
                failed += 1
                continue
            try:
                worst = max(run_case(binary, spec, c, os.path.join(tmp, f"{name}_{i}")) for i, c in enumerate(cases))
                print(f"ok   {name} ({len(cases)} case{'s' if len(cases) > 1 else ''}, max rel error {worst:.2g})")
                passed += 1
            except AssertionError as e:
                print(f"FAIL {name}: {e}")
                failed += 1
            except Exception as e:  # e.g. a reference reading an attribute the op does not list
                print(f"FAIL {name}: {type(e).__name__}: {e}")
                failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not specs else 0


if __name__ == "__main__":
    sys.exit(main())
