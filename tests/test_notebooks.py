"""Every notebook in notebooks/ runs top to bottom at small sizes (SPECTRAL_JAX_NOTEBOOK_SMALL)."""

from __future__ import annotations

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_notebooks_exist_and_are_stored_without_outputs():
    assert [p.name for p in NOTEBOOKS][:2] == ["01_quickstart.ipynb",
                                               "02_approximation_quality.ipynb"]
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        for cell in book.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path.name


def test_the_sites_copies_are_the_notebooks_run_to_the_end():
    # The site shows docs/notebooks/ (written by docs/execute_notebooks.py): each notebook's
    # cells, unchanged, every code cell run without error, the figures included.
    executed = NOTEBOOKS[0].parent.parent / "docs" / "notebooks"
    assert sorted(p.name for p in executed.glob("*.ipynb")) == [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        source = nbformat.read(path, as_version=4)
        copy = nbformat.read(executed / path.name, as_version=4)
        assert [(c.cell_type, c.source) for c in copy.cells] == [
            (c.cell_type, c.source) for c in source.cells], (
            f"{path.name} changed: run `python docs/execute_notebooks.py {path.stem}`")
        code = [c for c in copy.cells if c.cell_type == "code"]
        assert all(c.execution_count is not None for c in code), path.name
        outputs = [o for c in code for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"], path.name
        if path.stem != "01_quickstart":
            assert any("image/png" in o.get("data", {}) for o in outputs), path.name


# Executing a notebook trains or sweeps at small sizes, too long for every CI run: they run
# with `-m slow` (the README's Python snippets run in CI instead, tests/test_readme.py).
_CI_NOTEBOOKS = ()


@pytest.mark.notebook
@pytest.mark.parametrize(
    "path",
    [p if p.stem in _CI_NOTEBOOKS else pytest.param(p, marks=pytest.mark.slow) for p in NOTEBOOKS],
    ids=lambda p: p.stem)
def test_notebook_runs(path, monkeypatch):
    monkeypatch.setenv("SPECTRAL_JAX_NOTEBOOK_SMALL", "1")
    book = nbformat.read(path, as_version=4)
    # kernel "python3" resolves to this interpreter (jupyter_client substitutes
    # sys.executable for the kernel spec's "python"), i.e. the project's venv.
    client = nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
