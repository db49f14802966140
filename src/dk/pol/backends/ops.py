"""Which ATen operations the rounded backend runs as is, covers, or refuses (SPEC VI §1).

Names are ATen overload packets with a trailing ``_`` removed (``add_`` and ``add`` are one
entry; the schema says which arguments an in-place or ``out=`` form writes).
"""

from __future__ import annotations

from typing import Any

EXACT = "exact"
COVERED = "covered"
SPLIT = "split"
UNKNOWN = "unknown"

# Float32 results that do not depend on thread count, vector width or reduction order:
# data movement, creation, comparisons, selection, and arithmetic IEEE-754 rounds once.
EXACT_OPS = frozenset(
    """
    alias as_strided clone contiguous copy detach expand expand_as lift_fresh lift_fresh_copy
    permute reshape select slice squeeze t transpose unsqueeze view _unsafe_view unfold
    view_as _reshape_alias unbind split split_with_sizes chunk narrow cat stack flatten
    _to_copy to _conj conj resolve_conj resolve_neg _neg_view _local_scalar_dense
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros
    ones ones_like new_ones full full_like new_full fill zero scalar_tensor arange
    index index_select gather embedding masked_fill where scatter masked_select take
    eq ne lt le gt ge logical_and logical_or logical_not logical_xor isnan isinf isfinite
    any all nonzero argmax argmin max min amax amin maximum minimum clamp clamp_min clamp_max
    sort topk sign abs neg relu threshold threshold_backward hardtanh hardtanh_backward
    mul floor ceil trunc round frac remainder fmod
    max_pool2d_with_indices is_same_size _has_compatible_shallow_copy_type
    select_backward slice_backward as_strided_scatter slice_scatter select_scatter
    equal is_nonzero item sym_size sym_stride sym_numel sym_storage_offset
    _fused_sdp_choice tril triu
    """.split()
)

# Results that differ with the thread count or kernel (reductions, fused or transcendental
# elementwise kernels): computed in float64 and rounded to float32 at a logged site.
COVERED_OPS = frozenset(
    """
    mm addmm bmm baddbmm addmv mv dot matmul linear addbmm
    convolution convolution_backward _convolution
    sum mean var var_mean std std_mean norm linalg_vector_norm prod cumsum logsumexp
    _softmax _safe_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data
    native_layer_norm native_layer_norm_backward
    native_batch_norm native_batch_norm_backward _native_batch_norm_legit
    _native_batch_norm_legit_functional _native_batch_norm_legit_no_training
    nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward
    mse_loss mse_loss_backward
    exp expm1 log log1p log2 tanh tanh_backward sigmoid sigmoid_backward gelu gelu_backward
    silu silu_backward erf sin cos rsqrt pow
    embedding_dense_backward index_add scatter_add index_put
    avg_pool2d avg_pool2d_backward _adaptive_avg_pool2d _adaptive_avg_pool2d_backward
    max_pool2d_with_indices_backward
    _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention_for_cpu_backward
    _foreach_norm _foreach_exp
    """.split()
)

# Normalisations run as torch's own decompositions (torch._decomp) under the mode: their
# reductions become covered sites, their per-element arithmetic exact float32 operations, so the
# normalised activations and their gradients are no rounding sites (half a ResNet's log).
# Checked before COVERED_OPS, which keeps them for a release without a decomposition.
DECOMPOSED_OPS = frozenset(
    """
    native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training
    native_batch_norm_backward native_layer_norm native_layer_norm_backward
    """.split()
)
DECOMPOSED = "decomposed"

# Random fills that are a serial loop over a generator on the CPU (values depend on the
# generator's state only, never on the thread count): dk's Dropout masks. CPU only.
RANDOM_OPS = frozenset("rand uniform".split())
RANDOM = "random"

# Arithmetic that is exact for alpha == 1 and a fused multiply-add otherwise.
ALPHA_OPS = frozenset("add sub rsub _foreach_add _foreach_sub".split())
# Fused elementwise arithmetic, split into float32 operations IEEE-754 rounds once (SPEC VI §1).
SPLIT_OPS = frozenset(
    "addcmul addcdiv lerp _foreach_addcmul _foreach_addcdiv _foreach_lerp".split()
)
# Foreach forms of exact arithmetic.
EXACT_FOREACH = frozenset(
    "_foreach_mul _foreach_neg _foreach_zero _foreach_copy _foreach_maximum "
    "_foreach_clamp_min _foreach_clamp_max _foreach_abs".split()
)
# Float32 operations IEEE-754 rounds once that torch's kernels do not always (the CPU's sqrt,
# CUDA's division by a host scalar): computed on float64 copies and rounded once (SPEC VI §1).
ROUNDED64_OPS = frozenset(
    "div sqrt reciprocal _foreach_div _foreach_sqrt _foreach_reciprocal".split()
)
ROUNDED64 = "rounded64"

_cache: dict[Any, str] = {}


def classify(func: Any, args: Any, kwargs: Any) -> str:
    """``EXACT``, ``ROUNDED64``, ``COVERED``, ``SPLIT``, ``DECOMPOSED``, ``RANDOM`` or
    ``UNKNOWN`` for one call (SPEC VI §1)."""
    kind = _cache.get(func)
    if kind is None:
        kind = _static_kind(func)
        _cache[func] = kind
    if kind == "alpha":
        alpha = kwargs.get("alpha", 1)
        return EXACT if alpha == 1 else SPLIT
    return kind


def _static_kind(func: Any) -> str:
    if func.namespace != "aten":
        return UNKNOWN
    base = func.overloadpacket.__name__.rstrip("_")
    if base in ALPHA_OPS:
        return "alpha"
    if base in ROUNDED64_OPS:
        return ROUNDED64
    if base in EXACT_OPS or base in EXACT_FOREACH:
        return EXACT
    if base in DECOMPOSED_OPS:
        from torch._decomp import decomposition_table

        if func in decomposition_table:
            return DECOMPOSED
    if base in COVERED_OPS:
        return COVERED
    if base in SPLIT_OPS:
        return SPLIT
    if base in RANDOM_OPS:
        return RANDOM
    return UNKNOWN


def unsupported_message(func: Any) -> str:
    """The one-line record-time error for an op the backend does not cover."""
    name = str(func)
    hint = (
        "; for dropout use dk.pol.augment.Dropout (its masks replay)"
        if any(w in name for w in ("bernoulli", "dropout", "rand"))
        else ""
    )
    return (
        f"rounded backend: {func} on floating tensors is not covered (SPEC VI §1); "
        "its float32 result may differ across threads or machines, so this model cannot be "
        f"trained in exact mode with pol.backend = 'rounded'{hint}"
    )


def bind(func: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    """The arguments of the call ``func(*args, **kwargs)`` by their schema names, with the
    schema's defaults for those not given."""
    vals: dict[str, Any] = {}
    for i, arg in enumerate(func._schema.arguments):
        if not arg.kwarg_only and i < len(args):
            vals[arg.name] = args[i]
        elif arg.name in kwargs:
            vals[arg.name] = kwargs[arg.name]
        else:
            vals[arg.name] = arg.default_value
    return vals
