"""Sphinx directives that build the site's method tables and API lists from the code.

``method-table`` and ``shard-table`` render rows of the attention registry
(``spectral_jax.attention.ATTENTIONS``) and ``public-api`` documents the names in a module's
``__all__``, so no list is written by hand and none can fall behind the code. The method
pages are the family packages (a method's page is its registry entry's ``family``);
``tests/test_docs_site.py`` checks that each has its page.
"""

from __future__ import annotations

import importlib
import inspect
import re

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective


def families() -> tuple[str, ...]:
    """The method pages: the family packages that hold a registered method, in registry order."""
    from spectral_jax.attention import ATTENTIONS

    return tuple(dict.fromkeys(spec.family for spec in ATTENTIONS.values()))


def family_of_name(name: str) -> str:
    """The family package of ``spectral_jax.attention`` whose ``__all__`` holds ``name``, or
    ``"none"`` (the registry, decoding and shared helpers)."""
    import spectral_jax.attention as attention

    for family in families():
        if name in importlib.import_module(f"{attention.__name__}.{family}").__all__:
            return family
    return "none"


def family_methods(family: str) -> tuple[str, ...]:
    """The registered methods whose function lives in the family package, in registry order."""
    from spectral_jax.attention import ATTENTIONS

    return tuple(name for name, spec in ATTENTIONS.items() if spec.family == family)


METHOD_COLUMNS = ("registry name", "function", "source", "cost per head", "causal",
                  "budget", "approximates")


def method_rows(names: tuple[str, ...] | None = None) -> list[tuple[str, ...]]:
    """One row per registered method (all of them, in registry order, when names is None)."""
    from spectral_jax.attention import ATTENTIONS

    rows = []
    for name in names or tuple(ATTENTIONS):
        spec = ATTENTIONS[name]
        causal = ("causal only" if spec.causal_only
                  else "yes" if spec.supports_causal else "no")
        rows.append((spec.name, spec.fn.__name__, spec.source, spec.cost, causal,
                     spec.budget or "-", "exact" if spec.exact else spec.target))
    return rows


def public_names(module_name: str, match: str | None = None) -> list[str]:
    """The names of ``module.__all__`` (those matching the regular expression, if given)."""
    module = importlib.import_module(module_name)
    names = list(module.__all__)
    if match:
        names = [name for name in names if re.search(match, name)]
    return names


# Documented in this order: a name re-exported by a later module (``linen.TransformerConfig``
# is ``nn.TransformerConfig``) is shown there too but indexed once, where it is defined.
API_MODULES = ("spectral_jax.attention", "spectral_jax.nn", "spectral_jax.linen",
               "spectral_jax.parallel", "spectral_jax")


def _indexed_elsewhere(module_name: str, obj: object) -> bool:
    """Whether an earlier module of ``API_MODULES`` exports the same object."""
    if module_name not in API_MODULES:
        return True
    for other in API_MODULES[:API_MODULES.index(module_name)]:
        module = importlib.import_module(other)
        if any(getattr(module, name) is obj for name in module.__all__):
            return True
    return False


def describe_value(obj: object) -> str:
    """One line saying what a public constant holds (its type's docstring would say nothing)."""
    if isinstance(obj, str | int | float):
        return f"``{obj!r}``"
    if hasattr(obj, "keys"):
        keys = ", ".join(f"``{key}``" for key in obj)
        return f"A mapping of {len(obj)} entries, keyed by {keys}."
    if isinstance(obj, tuple | frozenset | set | list):
        items = ", ".join(f"``{item!r}``" for item in sorted(obj, key=str))
        return f"A {type(obj).__name__} of {len(obj)}: {items}."
    return f"A ``{type(obj).__name__}``."


def api_lines(module_name: str, names: list[str], summary_only: bool) -> list[str]:
    """reStructuredText documenting ``names`` of the module: a summary table, then each entry."""
    module = importlib.import_module(module_name)
    # Constants are listed by their own entries: autosummary would show their type's docstring.
    code = [name for name in names if callable(getattr(module, name))]
    lines = [f".. currentmodule:: {module_name}", ""]
    if code:
        lines += [".. autosummary::", "", *[f"   {name}" for name in code], ""]
    if summary_only:
        return lines + [f"- :data:`{name}`" for name in names if name not in code] + [""]
    for name in names:
        obj = getattr(module, name)
        no_index = ["   :no-index:"] if _indexed_elsewhere(module_name, obj) else []
        if inspect.isclass(obj):
            lines += [f".. autoclass:: {name}", "   :members:",
                      "   :special-members: __call__", *no_index, ""]
        elif callable(obj):
            lines += [f".. autofunction:: {name}", *no_index, ""]
        else:
            lines += [f".. py:data:: {name}", f"   :type: {type(obj).__name__}", *no_index,
                      "", f"   {describe_value(obj)}", ""]
    return lines


def error_rows(paths: list[str], budget: int) -> tuple[list[str], list[tuple[str, ...]]]:
    """Mean relative output error per method and regime at ``budget``, from ``bench error`` JSON.

    A method without a budget (``gated_linear``) has one value per regime, taken as it is.
    Returns the regimes (columns after the method) and one row per method, in file order.
    """
    import json

    regimes: list[str] = []
    values: dict[str, dict[str, float]] = {}
    for path in paths:
        with open(path) as f:
            summary = json.load(f)["summary"]
        for rec in summary:
            if rec["budget"] not in (budget, None):
                continue
            if rec["regime"] not in regimes:
                regimes.append(rec["regime"])
            values.setdefault(rec["method"], {})[rec["regime"]] = rec["output_mean"]
    rows = [(method, *(f"{per[r]:.2g}" if r in per else "-" for r in regimes))
            for method, per in values.items()]
    return regimes, rows


SHARD_COLUMNS = ("registry name", "sequence-sharded form", "numbers moved per forward call and "
                 "(example, head)")


def shard_rows() -> list[tuple[str, ...]]:
    """One row per registered method: its ``sequence_parallel`` form and ``communication``."""
    from spectral_jax.attention import ATTENTIONS

    return [(spec.name, spec.sequence_parallel or "-", spec.communication or "does not shard")
            for spec in ATTENTIONS.values()]


def _cell(text: str, literal: bool, function: bool) -> nodes.entry:
    """One table cell: plain text, a literal, or a literal linking to the function's API entry."""
    para = nodes.paragraph()
    if function:
        ref = addnodes.pending_xref("", refdomain="py", reftype="func", refexplicit=False,
                                    reftarget=f"spectral_jax.attention.{text}")
        ref += nodes.literal(text, text)
        para += ref
    else:
        para += nodes.literal(text, text) if literal else nodes.Text(text)
    entry = nodes.entry()
    entry += para
    return entry


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]],
           literal_columns: tuple[int, ...] = (), function_column: int | None = None
           ) -> nodes.table:
    """A docutils table: a header row, then ``rows``, with literal and linked columns."""
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    group += [nodes.colspec(colwidth=1) for _ in header]
    head, body = nodes.thead(), nodes.tbody()
    row = nodes.row()
    row += [_cell(text, False, False) for text in header]
    head += row
    for cells in rows:
        row = nodes.row()
        row += [_cell(text, column in literal_columns and text != "-",
                      column == function_column) for column, text in enumerate(cells)]
        body += row
    group += [head, body]
    return table


class ErrorTable(SphinxDirective):
    """``.. bench-error-table:: FILE.json [FILE.json ...]`` with ``:budget: N`` (default 64)."""

    required_arguments = 1
    final_argument_whitespace = True
    option_spec = {"budget": directives.positive_int}

    def run(self) -> list[nodes.Node]:
        paths = [self.env.relfn2path(arg)[1] for arg in self.arguments[0].split()]
        for path in paths:
            self.env.note_dependency(path)
        regimes, rows = error_rows(paths, self.options.get("budget", 64))
        return [_table(("method", *[r.replace("_", " ") for r in regimes]), rows, (0,))]


class MethodTable(SphinxDirective):
    """``.. method-table:: [family]``: the registry's rows, all or one family's."""

    optional_arguments = 1

    def run(self) -> list[nodes.Node]:
        from spectral_jax.attention import ATTENTIONS, _registry

        names = family_methods(self.arguments[0]) if self.arguments else None
        # Rebuild the page when the registry or a method's signature changes.
        self.env.note_dependency(inspect.getsourcefile(_registry))
        for name in names or tuple(ATTENTIONS):
            self.env.note_dependency(inspect.getsourcefile(ATTENTIONS[name].fn))
        return [_table(METHOD_COLUMNS, method_rows(names), literal_columns=(0, 5),
                       function_column=1)]


class ShardTable(SphinxDirective):
    """``.. shard-table::``: every method's sequence-sharded form and its traffic formula."""

    def run(self) -> list[nodes.Node]:
        from spectral_jax.attention import _registry

        self.env.note_dependency(inspect.getsourcefile(_registry))
        return [_table(SHARD_COLUMNS, shard_rows(), literal_columns=(0, 1, 2))]


class PublicApi(SphinxDirective):
    """``.. public-api:: module``: every name of ``module.__all__`` with its docstring.

    Options: ``:match: REGEX`` keeps the names it matches (none: nothing is shown);
    ``:family: NAME`` keeps those that family package of ``spectral_jax.attention`` exports
    (``none``: those no family exports), still documented under ``module``;
    ``:summary-only:`` lists them with links and first lines only (for pages beside the API
    reference, which documents each name once).
    """

    required_arguments = 1
    option_spec = {"match": directives.unchanged, "family": directives.unchanged,
                   "summary-only": directives.flag}

    def run(self) -> list[nodes.Node]:
        module_name = self.arguments[0]
        self.env.note_dependency(inspect.getsourcefile(importlib.import_module(module_name)))
        names = public_names(module_name, self.options.get("match"))
        if "family" in self.options:
            names = [name for name in names
                     if family_of_name(name) == self.options["family"]]
        if not names:  # a page listing names from several modules shows the ones that match
            return []
        lines = api_lines(module_name, names, "summary-only" in self.options)
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=f"<public-api {module_name}>"),
                                self.content_offset, container)
        return container.children


def _module_signature(app, what, name, obj, options, signature, return_annotation):
    """An NNX module's signature from its ``__init__`` (its metaclass's is ``*args, **kwargs``)."""
    if what != "class" or not signature or not signature.startswith("(*args"):
        return None
    init = inspect.signature(obj.__init__)
    params = list(init.parameters.values())[1:]
    return str(init.replace(parameters=params, return_annotation=inspect.Signature.empty)), None


def setup(app):
    app.connect("autodoc-process-signature", _module_signature)
    app.add_directive("method-table", MethodTable)
    app.add_directive("public-api", PublicApi)
    app.add_directive("bench-error-table", ErrorTable)
    app.add_directive("shard-table", ShardTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
