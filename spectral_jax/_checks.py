"""Argument checks shared by every package: one rule and one message format.

Every check raises with the message ``"{owner}: `{name}` must be {what}; got {value!r}."``,
where ``owner`` says who asked (``"nystrom_attention()"``, ``"config"``, ``"load_task('text')"``)
and ``name`` is the parameter as the caller spells it (``num_landmarks``, ``train.steps``).

Every error raised for bad input from a caller, here and in every package, is a
:class:`UsageError`: the ``spectral-jax`` command prints it as one line, while any other
exception is a bug and keeps its traceback. Each kind is also the built-in exception a
Python caller expects (``UsageTypeError`` is a ``TypeError``, ...), so ``except ValueError``
keeps working.

The rule, the same in every package:

* **TypeError** when the value is not of the parameter's kind at all: a string, ``None``
  (unless allowed), a list or an array with dimensions where a number is expected; anything but
  a bool where a bool is expected.
* **ValueError** when it is of the right kind but not an allowed value: out of range, NaN or
  infinite, or not one of a choice's values.
* **NumberKindError**, a subclass of both, for a number of the wrong kind: a float where an
  int is expected (``2.5``, ``4.0``), or a bool where a number is expected (``True`` is an int
  to Python but never a count or a rate). It is a wrong type, and also a bad value to callers
  that catch ValueError for bad numbers (as NumPy's ``AxisError`` is both a ValueError and an
  IndexError).
* NumPy integers and floats (from config files, sweeps) are accepted wherever Python ones are,
  and are returned as Python ``int`` / ``float``; float checks also accept 0-d arrays.
* A value traced by ``jax.jit`` is never a valid Python-level parameter (it sets shapes or
  control flow): every check refuses it with a message saying how to keep it static.

Example:
    >>> from spectral_jax import _checks
    >>> _checks.positive_int("nystrom_attention()", "num_landmarks", 64)
    64
    >>> _checks.positive_int("nystrom_attention()", "num_landmarks", 0)
    Traceback (most recent call last):
    ...
    spectral_jax.UsageError: nystrom_attention(): `num_landmarks` must be a positive int; got 0.
"""

from __future__ import annotations

import math
import numbers
import sys
import threading
import zlib
from typing import Any

import numpy as np

__all__ = ["NumberKindError", "UnknownNameError", "UnsupportedError", "UsageError",
           "UsageTypeError", "boolean", "choice", "device_check", "message", "nonnegative_int",
           "number", "positive_int", "reject_traced"]


class UsageError(ValueError):
    """Bad input from the caller: a value, a shape, a name or a combination that is not allowed.

    The marker class of every user error in spectral_jax; its subclasses add the built-in kind
    a caller may catch (``TypeError``, ``KeyError``, ``NotImplementedError``).

    Example:
        >>> isinstance(UsageTypeError("f(): `x` must be an int; got 'a'."), (UsageError, TypeError))
        True
    """


class UsageTypeError(UsageError, TypeError):
    """A value of the wrong kind (a string where a number is expected, ...)."""


class UnknownNameError(UsageError, KeyError):
    """A name that is not registered (a method, a task, a config field).

    ``str()`` gives the message itself, not KeyError's quoted form.

    Example:
        >>> str(UnknownNameError("unknown task 'x'; known: listops, text."))
        "unknown task 'x'; known: listops, text."
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnsupportedError(UsageError, NotImplementedError):
    """A valid request that this method cannot serve (a mask it cannot honour, causal
    attention for a method without a causal form)."""


class NumberKindError(UsageTypeError):
    """A number of the wrong kind: a float or a bool where an int is expected, a bool for a float.

    Example:
        >>> try:
        ...     positive_int("f()", "num_landmarks", 2.5)
        ... except ValueError as err:  # also a TypeError
        ...     print(type(err).__name__, err)
        NumberKindError f(): `num_landmarks` must be a positive int; got 2.5.
    """


def message(owner: str, name: str, what: str, value: Any) -> str:
    """The one message format: ``"{owner}: `{name}` must be {what}; got {value!r}."``.

    Example:
        >>> message("config", "train.steps", "a positive int", 0)
        'config: `train.steps` must be a positive int; got 0.'
    """
    return f"{owner}: `{name}` must be {what}; got {value!r}."


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def reject_traced(owner: str, name: str, value: Any) -> None:
    """A UsageTypeError for a value traced by ``jax.jit``, saying how to keep it static.

    JAX is looked up, not imported: a traced value exists only once JAX is loaded, and the
    command line's help must not load it.

    Raises:
        UsageTypeError: ``value`` is a ``jax.core.Tracer``.
    """
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.core.Tracer):
        fn = owner.removesuffix("()")
        raise UsageTypeError(
            f"{owner}: `{name}` must be a static Python value, but it is traced "
            f"({value!r}): it sets shapes or control flow, so it cannot be a jit argument. "
            f"Bind it before jitting, jax.jit(functools.partial({fn}, {name}=...)), or "
            f"mark it static, jax.jit(f, static_argnames=('{name}',))."
        )


def _integer(owner: str, name: str, value: Any, what: str) -> int:
    reject_traced(owner, name, value)
    if _is_bool(value):
        raise NumberKindError(message(owner, name, what, value))
    if isinstance(value, (numbers.Integral, np.integer)):
        return int(value)
    if isinstance(value, (numbers.Real, np.floating)):  # 2.5 or 4.0: a number, not a count
        raise NumberKindError(message(owner, name, what, value))
    raise UsageTypeError(message(owner, name, what, value))


def positive_int(owner: str, name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """``value`` as a Python int >= 1 (or None when ``allow_none``).

    Raises:
        TypeError: not a number (e.g. a string).
        NumberKindError: a bool or a float.
        ValueError: an int < 1.

    Example:
        >>> positive_int("f()", "num_features", np.int64(8))
        8
    """
    if value is None and allow_none:
        return None
    what = "a positive int" + (" or None" if allow_none else "")
    number_ = _integer(owner, name, value, what)
    if number_ < 1:
        raise UsageError(message(owner, name, what, value))
    return number_


def nonnegative_int(owner: str, name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """``value`` as a Python int >= 0 (or None when ``allow_none``).

    Raises:
        TypeError: not a number.
        NumberKindError: a bool or a float.
        ValueError: a negative int.

    Example:
        >>> nonnegative_int("f()", "pinv_iterations", 0)
        0
    """
    if value is None and allow_none:
        return None
    what = "a non-negative int" + (" or None" if allow_none else "")
    number_ = _integer(owner, name, value, what)
    if number_ < 0:
        raise UsageError(message(owner, name, what, value))
    return number_


def number(
    owner: str,
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
    what: str | None = None,
) -> float | None:
    """``value`` as a finite Python float in the interval ``low .. high``.

    Args:
        owner, name, value: as for every check.
        low, high: bounds (None: unbounded on that side).
        low_open, high_open: exclude the bound itself (``low_open``: ``value > low``).
        allow_none: return None for None.
        what: the description in the message; default e.g. ``"a finite number in [0, 1)"``.

    Raises:
        TypeError: not a real number (a string, a list, an array with dimensions).
        NumberKindError: a bool.
        ValueError: NaN, infinite, or outside the interval.

    Example:
        >>> number("config", "model.dropout_rate", np.float32(0.5), low=0.0, high=1.0,
        ...        high_open=True)
        0.5
        >>> number("config", "train.optimizer.eps", 0.0, low=0.0, low_open=True)
        Traceback (most recent call last):
        ...
        spectral_jax.UsageError: config: `train.optimizer.eps` must be a finite number > 0; got 0.0.
    """
    if value is None and allow_none:
        return None
    if what is None:
        what = "a finite number" + _interval(low, high, low_open, high_open)
        if allow_none:
            what += " or None"
    reject_traced(owner, name, value)
    if _is_bool(value):
        raise NumberKindError(message(owner, name, what, value))
    if isinstance(value, (numbers.Real, np.integer, np.floating)):
        result = float(value)
    elif np.ndim(value) == 0 and np.issubdtype(getattr(value, "dtype", object), np.number) and \
            not np.issubdtype(value.dtype, np.complexfloating):
        result = float(value)
    else:
        raise UsageTypeError(message(owner, name, what, value))
    ok = math.isfinite(result)
    if ok and low is not None:
        ok = result > low if low_open else result >= low
    if ok and high is not None:
        ok = result < high if high_open else result <= high
    if not ok:
        raise UsageError(message(owner, name, what, value))
    return result


def _interval(low, high, low_open, high_open) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high:g}"
    return ""


def choice(owner: str, name: str, value: Any, allowed: tuple[Any, ...] | list[Any]) -> Any:
    """``value`` if it is one of ``allowed``; a ValueError listing them otherwise.

    Example:
        >>> choice("f()", "feature_map", "tanh", ("elu", "relu"))
        Traceback (most recent call last):
        ...
        spectral_jax.UsageError: f(): `feature_map` must be one of ('elu', 'relu'); got 'tanh'.
    """
    allowed = tuple(allowed)
    reject_traced(owner, name, value)
    try:
        ok = value in allowed
    except (TypeError, ValueError):  # unhashable, or an array: not one of the choices
        ok = False
    if not ok:
        raise UsageError(message(owner, name, f"one of {allowed}", value))
    return value


def boolean(owner: str, name: str, value: Any) -> bool:
    """``value`` as a Python bool; a TypeError for anything else (``1``, ``"yes"``).

    Example:
        >>> boolean("f()", "is_causal", np.bool_(True))
        True
    """
    reject_traced(owner, name, value)
    if not _is_bool(value):
        raise UsageTypeError(message(owner, name, "a bool", value))
    return bool(value)


# Tracebacks and doctests name them where users import them: ``spectral_jax.UsageError``.
for _cls in (UsageError, UsageTypeError, UnknownNameError, UnsupportedError, NumberKindError):
    _cls.__module__ = "spectral_jax"


_CODE_LOCK = threading.Lock()


def device_check(pred: Any, message: str, *fmt_args: Any) -> None:
    """``jax.experimental.checkify.debug_check`` with an error code fixed by ``message``.

    For a verdict that only exists on the device (a traced mask, traced token ids): without
    ``checkify`` the check adds nothing to what runs; under ``checkify.checkify`` it raises
    ``message`` (formatted with ``fmt_args``, traced scalars) as ``debug_check`` does.

    ``debug_check`` numbers each check from a process-wide counter while tracing and writes the
    number into the lowered program, with or without ``checkify``. Two traces of the same model
    then lower to different programs, and every retrace (a second run in one process, a
    notebook cell run again, a resumed job whose tracing order differs) misses JAX's
    persistent compilation cache and compiles from scratch. Here the number is a checksum of
    the message, so the program depends on the model alone. Distinct messages get distinct
    numbers; checks sharing a message report the same text. Where this JAX has no counter to
    fix, it falls back to plain ``debug_check``.

    Args:
        pred: scalar bool, traced or not: ``True`` means the input is valid.
        message: the error, with ``{}`` fields for ``fmt_args``.
        *fmt_args: arrays (usually traced scalars) formatted into the message.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.experimental import checkify
        >>> def f(x):
        ...     device_check(jnp.all(x > 0), "`x` must be positive; min {}", jnp.min(x))
        ...     return x
        >>> err, _ = jax.jit(checkify.checkify(f))(jnp.array([1.0, -2.0]))
        >>> err.get()
        '`x` must be positive; min -2.0 (`check` failed)'
    """
    from jax._src import checkify as impl  # the counter lives in the implementation module
    from jax.experimental import checkify

    if not callable(getattr(impl, "next_code", None)):
        checkify.debug_check(pred, message, *fmt_args)
        return
    code = zlib.crc32(message.encode()) % (2**31 - 2) + 1  # an int32 > 0, as the counter's
    with _CODE_LOCK:
        counter = impl.next_code
        impl.next_code = lambda: code
        try:
            checkify.debug_check(pred, message, *fmt_args)
        finally:
            impl.next_code = counter
