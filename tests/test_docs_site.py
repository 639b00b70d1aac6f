"""The documentation site's generated parts cover the code: every registered method is on a
family page and in the method table, every public name of the library's packages is in the
API reference, and the error table reads the committed ``bench error`` JSON."""

from __future__ import annotations

import importlib
import json
import pathlib
import re
import sys

import pytest

pytest.importorskip("sphinx")

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import spectral_docs  # noqa: E402

from spectral_jax.attention import ATTENTIONS, available_attentions  # noqa: E402


def test_every_registered_method_is_on_exactly_one_family_page():
    placed = [name for family in spectral_docs.families()
              for name in spectral_docs.family_methods(family)]
    assert sorted(placed) == sorted(available_attentions())
    assert spectral_docs.families() == ("exact", "landmark", "kernel", "compressed", "summary",
                                        "sparse", "recurrent")
    for family in spectral_docs.families():
        page = (DOCS / "methods" / f"{family}.md").read_text()
        assert f"```{{method-table}} {family}\n```" in page, family
    toctree = (DOCS / "methods" / "index.md").read_text()
    assert all(f"\n{family}\n" in toctree for family in spectral_docs.families())


def test_method_table_rows_are_the_registry():
    rows = spectral_docs.method_rows()
    assert [row[0] for row in rows] == list(available_attentions())
    by_name = {row[0]: row for row in rows}
    assert by_name["nystrom"] == ("nystrom", "nystrom_attention", ATTENTIONS["nystrom"].source,
                                  "O(nmd + m³)", "no", "num_landmarks", "softmax")
    assert by_name["gated_linear"][4] == "causal only"
    assert by_name["softmax"][6] == "exact"
    assert by_name["skyformer"][6] == "kernelized"


def test_shard_table_rows_are_the_registry():
    rows = {row[0]: row for row in spectral_docs.shard_rows()}
    assert list(rows) == list(available_attentions())
    assert rows["nystrom"] == ("nystrom", "landmark_reductions",
                               ATTENTIONS["nystrom"].communication)
    page = (DOCS / "parallel.md").read_text()
    assert "```{shard-table}\n```" in page


@pytest.mark.parametrize("module_name", spectral_docs.API_MODULES[:4])
def test_api_page_documents_every_public_name(module_name):
    module = importlib.import_module(module_name)
    page = (DOCS / "api" / f"{module_name.split('.')[-1]}.rst").read_text()
    assert f".. public-api:: {module_name}\n" in page
    lines = spectral_docs.api_lines(module_name, spectral_docs.public_names(module_name),
                                    summary_only=False)
    documented = [m.group(1) for line in lines
                  if (m := re.match(r"\.\. (?:autoclass|autofunction|py:data):: (\w+)$", line))]
    assert documented == list(module.__all__)


def test_reexported_names_are_indexed_once():
    lines = spectral_docs.api_lines("spectral_jax.linen", ["TransformerConfig"],
                                    summary_only=False)
    assert "   :no-index:" in lines
    lines = spectral_docs.api_lines("spectral_jax.nn", ["TransformerConfig"], summary_only=False)
    assert "   :no-index:" not in lines


def test_error_table_reads_the_committed_json():
    paths = [str(ROOT / "benchmarks" / name)
             for name in ("error_shift_n1024.json", "error_survey_n1024.json")]
    regimes, rows = spectral_docs.error_rows(paths, 64)
    assert regimes == ["diffuse", "sharp", "random_walk", "varying_norm"]
    by_method = {row[0]: dict(zip(regimes, row[1:])) for row in rows}
    summary = json.loads(pathlib.Path(paths[0]).read_text())["summary"]
    sharp = next(r for r in summary if r["method"] == "spectral_shift" and r["regime"] == "sharp"
                 and r["budget"] == 64)
    assert by_method["spectral_shift"]["sharp"] == f"{sharp['output_mean']:.2g}"
    assert float(by_method["nystrom"]["random_walk"]) == pytest.approx(0.056, abs=5e-4)
    assert float(by_method["local"]["sharp"]) == pytest.approx(0.00017, rel=0.05)
    assert by_method["gated_linear"]["diffuse"] == "3.1"


@pytest.mark.slow
def test_site_builds_without_warnings_and_lists_every_public_name(tmp_path):
    from sphinx.cmd.build import build_main

    out = tmp_path / "html"
    assert build_main(["-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)]) == 0
    for module_name in spectral_docs.API_MODULES[:4]:
        html = (out / "api" / f"{module_name.split('.')[-1]}.html").read_text()
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if spectral_docs._indexed_elsewhere(module_name, getattr(module, name)):
                assert f'descname"><span class="pre">{name}</span>' in html, (module_name, name)
            else:
                assert f'id="{module_name}.{name}"' in html, (module_name, name)
    index = (out / "index.html").read_text()
    # The table is read after autodoc has imported every method: the defaults it derives the
    # causal column from are the functions' own.
    assert index.count("<td><p>causal only</p></td>") == sum(
        spec.causal_only for spec in ATTENTIONS.values())
    assert all(f"<code class=\"docutils literal notranslate\"><span class=\"pre\">{name}"
               in index for name in available_attentions())
