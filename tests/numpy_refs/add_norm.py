# NumPy reference of the residual add fused with a norm (add_layer_norm, add_rms_norm in
# src/autograd/ops.h), for tests/op_runner_numpy_test.py, which runs this file with its own names in
# scope (Case, randn, np, layer_norm_ref, rms_norm_ref, ...).
#
# sum = x + residual, y = norm(sum): the sum's cotangent and the norm's input gradient meet at the sum,
# and x and residual both get their total.


def add_norm_ref(norm_ref):
    def ref(xs, a):
        x, r, params = xs[0], xs[1], xs[2:]
        s = x + r
        (y,), norm_back = norm_ref([s] + params, a)

        def back(gs):
            gs_sum = gs[0] if gs[0] is not None else np.zeros_like(s)
            gs_y = gs[1] if gs[1] is not None else np.zeros_like(y)
            g_norm = norm_back([gs_y])
            total = gs_sum + g_norm[0]
            return [total, total] + g_norm[1:]

        return [s, y], back

    return ref


CASES = {
    "add_layer_norm": lambda: [
        Case([randn(2, 3, 5), randn(2, 3, 5), randn(5), randn(5)], add_norm_ref(layer_norm_ref), {"eps": 1e-5}),
        Case([randn(3, 7), randn(3, 7), randn(7), None], add_norm_ref(layer_norm_ref), {"eps": 1e-3}),
        # Only y gets a cotangent: the runner must treat the sum's as zeros.
        Case([randn(4, 6), randn(4, 6), randn(6), randn(6)], add_norm_ref(layer_norm_ref), {"eps": 1e-5},
             cotangents=[1])],
    "add_rms_norm": lambda: [
        Case([randn(2, 3, 5), randn(2, 3, 5), randn(5)], add_norm_ref(rms_norm_ref), {"eps": 1e-6}),
        Case([randn(3, 7), randn(3, 7), randn(7)], add_norm_ref(rms_norm_ref), {"eps": 1e-2}, cotangents=[0])],
}
