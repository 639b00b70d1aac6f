"""The state attention methods need, one small NNX module per kind of state.

Each module is built from its kind's module options (``spectral_jax.attention.STATE_KINDS``)
and the layer's sizes (``in_features``, ``num_heads``, ``head_dim``, dtypes, rngs; each takes
what it needs) and, called with the key length and ``deterministic`` (and the keywords
``inputs``, the block input keys are projected from, and ``carry``, the previous layer's
carried state, which kinds that need neither ignore), returns the keyword arguments it
contributes to the attention function. :class:`MultiHeadAttention` picks the module its
method's registry entry names through :data:`STATE_MODULES`, keyed by kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spectral_jax import UsageError, _checks
from spectral_jax import attention as _attention
from spectral_jax.attention import LINFORMER_SHARING, STATE_KINDS
from spectral_jax.attention._registry import methods_where
from spectral_jax.nn._learned_state import (
    GateState,
    InducingPointState,
    PackedSequenceState,
)
from spectral_jax.nn._memory_conv import MemoryConvState
from spectral_jax.nn._recurrent_gates import DeltaGate, GatedDeltaGate, LogDecayGate, SSDGate
from spectral_jax.nn._rngs import stream as _stream

Array = jax.Array

# The options checked here are MultiHeadAttention's attention_kwargs.
_OWNER = "MultiHeadAttention"


class RandomFeatures(nnx.Variable):
    """Performer's random projection: state that is not trained and never redrawn implicitly.

    Not an ``nnx.Param``, so ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` skips it; it is still
    part of ``nnx.state(model)`` and so of every checkpoint. In Linen (via ``nnx.bridge``) it
    lives in the ``"random_features"`` collection.
    """


nnx.register_variable_name("random_features", RandomFeatures)


class RandomFeatureState(nnx.Module):
    """Orthogonal random features ``(num_features, head_dim)``, changed only by :meth:`redraw`.

    Drawn from the ``"features"`` rng stream (else ``"params"``); Choromanski et al. 2021, §3.

    Example:
        >>> from flax import nnx
        >>> RandomFeatureState({"num_features": 8}, head_dim=4,
        ...     rngs=nnx.Rngs(0)).projection.shape
        (8, 4)
    """

    # Whether a call draws randomness (then the caller must say `deterministic`).
    random = False

    def __init__(self, options: Mapping[str, Any], *, head_dim: int, rngs: nnx.Rngs,
                 **_: Any) -> None:
        self.num_features = _checks.positive_int(_OWNER, "attention_kwargs['num_features']",
                                                 options["num_features"])
        self.head_dim = head_dim
        self.projection = RandomFeatures(self._draw(_stream(rngs, "features", "params")()))

    def _draw(self, key: Array) -> Array:
        return _attention.orthogonal_random_features(key, self.num_features, self.head_dim)

    def redraw(self, rng: Array) -> None:
        """Replaces the projection with a fresh draw from the PRNG key ``rng``."""
        self.projection[...] = self._draw(rng)

    def __call__(self, *, kv_len: int, deterministic: bool, **_: Any) -> dict[str, Array]:
        del kv_len, deterministic
        return {"projection": self.projection[...]}


def init_linformer_projection(
    proj_len: int, max_length: int, *, param_dtype: Any = jnp.float32, rngs: nnx.Rngs
) -> nnx.Param:
    """A learned Linformer length projection ``(proj_len, max_length)``, Xavier-uniform.

    Xavier-uniform with gain 1/√2 follows fairseq's ``MultiheadLinearAttention`` (Wang et al.
    2020). Inputs shorter than ``max_length`` use its first columns.

    Args:
        proj_len: projected length k.
        max_length: longest key sequence n.
        param_dtype: dtype of the parameter.
        rngs: the ``"params"`` stream draws it.

    Returns:
        ``nnx.Param`` of shape ``(proj_len, max_length)``.

    Example:
        >>> from flax import nnx
        >>> init_linformer_projection(4, 16, rngs=nnx.Rngs(0)).shape
        (4, 16)
    """
    init = nnx.initializers.variance_scaling(0.5, "fan_avg", "uniform")
    return nnx.Param(init(rngs.params(), (proj_len, max_length), param_dtype))


class LengthProjectionState(nnx.Module):
    """Learned length projections ``(proj_len, max_length)`` (Wang et al. 2020, §4).

    ``sharing``: ``"none"`` (separate key and value projections), ``"key_value"`` (one for
    both) or ``"layerwise"`` (one for both and for every layer: the encoder builds it once
    with :meth:`shared` and every layer's module uses that instance).

    Example:
        >>> from flax import nnx
        >>> state = LengthProjectionState({"proj_len": 4, "max_length": 16}, rngs=nnx.Rngs(0))
        >>> state.key_projection.shape, state.value_projection.shape
        ((4, 16), (4, 16))
    """

    random = False

    def __init__(self, options: Mapping[str, Any], *, param_dtype: Any = jnp.float32,
                 rngs: nnx.Rngs, _shared: bool = False, **_: Any) -> None:
        options = {**STATE_KINDS["length_projection"].options, **options}
        self.sharing = options["sharing"]
        if self.sharing not in LINFORMER_SHARING:
            raise UsageError(
                f"attention_kwargs['sharing'] must be one of {list(LINFORMER_SHARING)}, "
                f"got {self.sharing!r}."
            )
        if self.sharing == "layerwise" and not _shared:
            raise UsageError(
                "sharing='layerwise' uses one projection for every layer: pass the encoder's "
                "instance (LengthProjectionState.shared) as MultiHeadAttention(shared_state=...)."
            )
        self.max_length = _checks.positive_int(_OWNER, "attention_kwargs['max_length']",
                                               options["max_length"])
        self.proj_len = _checks.positive_int(_OWNER, "attention_kwargs['proj_len']",
                                             options["proj_len"])
        make = lambda: init_linformer_projection(  # noqa: E731
            self.proj_len, self.max_length, param_dtype=param_dtype, rngs=rngs)
        self.key_projection = make()
        self.value_projection = make() if self.sharing == "none" else nnx.data(None)

    @classmethod
    def shared(cls, options: Mapping[str, Any], *, param_dtype: Any = jnp.float32,
               rngs: nnx.Rngs) -> LengthProjectionState | None:
        """The one instance every layer uses with ``sharing="layerwise"``, else None."""
        if options.get("sharing") != "layerwise":
            return None
        return cls(options, param_dtype=param_dtype, rngs=rngs, _shared=True)

    def __call__(self, *, kv_len: int, deterministic: bool,
                 **_: Any) -> dict[str, Array | None]:
        del deterministic
        if kv_len > self.max_length:
            raise UsageError(
                f"Linformer key length must be <= attention_kwargs['max_length']="
                f"{self.max_length}, got kv_len={kv_len}."
            )
        value = None if self.value_projection is None else self.value_projection[...]
        return {"key_projection": self.key_projection[...], "value_projection": value}


class LandmarkRngState(nnx.Module):
    """A sampling rng stream: ``"landmarks"``, else ``"dropout"``, else ``"params"``.

    Training calls get a fresh key; evaluation (``deterministic=True``) gets none, so the
    method uses its deterministic choice (Skyformer's evenly spaced landmarks, the clustered
    methods' evenly spaced k-means start, ProbSparse's evenly spaced key sample) and two
    evaluation calls are bitwise equal.
    """

    random = True

    def __init__(self, options: Mapping[str, Any], *, rngs: nnx.Rngs, **_: Any) -> None:
        del options
        self.rng = _stream(rngs, "landmarks", "dropout", "params").fork()

    def __call__(self, *, kv_len: int, deterministic: bool, **_: Any) -> dict[str, Array]:
        del kv_len
        return {} if deterministic else {"rng": self.rng()}


# The module that owns each kind of state (keys: spectral_jax.attention.STATE_KINDS). Each
# says whether its calls are random (class attribute `random`; a module without it counts as
# random, so `deterministic` stays required for it).
STATE_MODULES: dict[str, type[nnx.Module]] = {
    "random_features": RandomFeatureState,
    "length_projection": LengthProjectionState,
    "landmark_rng": LandmarkRngState,
    "inducing_points": InducingPointState,
    "packed_sequence": PackedSequenceState,
    "gates": GateState,
    "memory_conv": MemoryConvState,
    "log_decay": LogDecayGate,
    "delta": DeltaGate,
    "gated_delta": GatedDeltaGate,
    "ssd": SSDGate,
}


def uses_rng(attention: str | _attention.AttentionSpec, dropout_rate: float = 0.0) -> bool:
    """Whether a layer of ``attention`` draws randomness in training (then ``deterministic``
    must be given, as for Flax's attention modules): weight dropout, or random state.

    Example:
        >>> uses_rng("nystrom"), uses_rng("skyformer"), uses_rng("softmax", 0.1)
        (False, True, True)
    """
    spec = _attention.get_attention_spec(attention)
    state = STATE_MODULES.get(spec.state) if spec.state is not None else None
    return dropout_rate > 0.0 or (state is not None and getattr(state, "random", True))


class ConvSkip(nnx.Module):
    """Nyströmformer's depthwise convolution skip on V (Xiong et al. 2021).

    One length-``kernel_size`` filter per head along the sequence, shared by the head's
    channels, zero padding, no bias (``mlpen/Nystromformer`` ``attention_nystrom.py``; the
    reference codes use 33, 35, 65). Padded positions of V are zeroed first.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> skip = ConvSkip(3, num_heads=2, rngs=nnx.Rngs(0))
        >>> skip(jnp.ones((1, 5, 2, 4)), None, 5).shape
        (1, 5, 2, 4)
    """

    def __init__(self, kernel_size: int, *, num_heads: int, param_dtype: Any = jnp.float32,
                 rngs: nnx.Rngs) -> None:
        kernel_size = _checks.positive_int(_OWNER, "attention_kwargs['conv_kernel_size']",
                                           kernel_size)
        if kernel_size % 2 == 0:
            raise UsageError(
                "attention_kwargs['conv_kernel_size'] must be odd (same-length "
                f"convolution), got {kernel_size}."
            )
        # PyTorch Conv default init (uniform, fan_in = kernel size), as the reference code.
        init = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=0)
        self.kernel = nnx.Param(init(rngs.params(), (kernel_size, 1, num_heads), param_dtype))

    def __call__(self, value: Array, mask: Array | None, q_len: int) -> Array:
        """Depthwise conv along the sequence of ``value`` (batch..., L, H, D), padding zeroed."""
        length, heads, dim = value.shape[-3:]
        if length != q_len:
            raise UsageError(
                f"conv_kernel_size needs self-attention lengths, got q_len={q_len} and "
                f"kv_len={length}."
            )
        batch = value.shape[:-3]
        if mask is not None:
            # Any rank the attention functions accept, (kv_len,) up to (batch..., heads, q_len,
            # kv_len): leading axes of size 1 make every rank the full one.
            mask = mask.reshape((1,) * (len(batch) + 3 - mask.ndim) + mask.shape)
            valid = jnp.any(mask, axis=-2)  # (batch..., heads|1, kv_len): any query uses it
            valid = jnp.swapaxes(valid, -1, -2)[..., None]  # (batch..., kv_len, heads|1, 1)
            value = value * valid.astype(value.dtype)
        # (batch..., L, H, D) -> (batch·D, L, H): heads are the conv's feature groups.
        v = jnp.moveaxis(value.reshape(-1, length, heads, dim), -1, 1).reshape(-1, length, heads)
        kernel = self.kernel[...].astype(v.dtype)
        y = jax.lax.conv_general_dilated(
            v,
            kernel,
            window_strides=(1,),
            padding="SAME",
            dimension_numbers=("NWC", "WIO", "NWC"),
            feature_group_count=heads,
        )
        y = jnp.moveaxis(y.reshape(-1, dim, length, heads), 1, -1)
        return y.reshape(*batch, length, heads, dim)


def redraw_features(model: nnx.Module, rng: Array) -> int:
    """Redraws every Performer projection in ``model``; a no-op for other models.

    Each random-feature state (one per :class:`MultiHeadAttention` with random features) gets
    its own key, ``jax.random.fold_in(rng, i)`` for the i-th in graph order.

    Args:
        model: any NNX module.
        rng: a JAX PRNG key.

    Returns:
        The number of projections redrawn.

    Example:
        >>> import jax
        >>> from flax import nnx
        >>> from spectral_jax.nn import MultiHeadAttention
        >>> layer = MultiHeadAttention(2, 8, attention="softmax", rngs=nnx.Rngs(0))
        >>> redraw_features(layer, jax.random.key(0))
        0
    """
    count = 0
    for _, module in nnx.iter_modules(model):
        if isinstance(module, RandomFeatureState):
            module.redraw(jax.random.fold_in(rng, count))
            count += 1
    return count


def redraw_state(state: Any, spec: _attention.AttentionSpec, rng: jax.Array) -> None:
    """Redraws a layer's random features; raises for a method without them."""
    if not isinstance(state, RandomFeatureState):
        users = methods_where(lambda other: other.state == "random_features")
        raise UsageError(f"redraw() needs attention with random features ({users}), got "
                         f"attention={spec.name!r}.")
    state.redraw(rng)

