"""What ``bench error`` / ``bench speed`` print and draw: spreads, line styles, notes."""

from __future__ import annotations

import math

from rich.console import Console

from spectral_jax.lra.bench import report


def _row(method, budget, mean, std, seeds, regime="diffuse"):
    return {"regime": regime, "method": method, "budget": budget, "seeds": seeds,
            "output_mean": mean, "output_std": std, "frobenius_mean": mean,
            "frobenius_std": std, "spectral_mean": math.nan, "spectral_std": math.nan}


def _text(table) -> list[str]:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text().splitlines()


def test_error_table_gives_a_spread_only_over_several_seeds():
    one = _text(report.error_table([_row("nystrom", 16, 0.12345, 0.0, seeds=1)]))
    [line] = [x for x in one if "nystrom" in x]
    assert line.split("│")[1:-1] == [" diffuse ", " nystrom ", "     16 ", "     1 ",
                                     "     0.1235 ", "        0.1235 ", "            — "]
    assert "±" not in "".join(one)
    two = _text(report.error_table([_row("nystrom", 16, 0.12345, 0.01, seeds=2)]))
    [line] = [x for x in two if "nystrom" in x]
    assert "0.1235 ± 0.0100" in line


def test_error_plot_keeps_coinciding_methods_apart(tmp_path, monkeypatch):
    figures, new_figure = [], report.new_figure

    def capture(mpl, **kwargs):
        figures.append(new_figure(mpl, **kwargs))
        return figures[-1]

    monkeypatch.setattr(report, "new_figure", capture)
    # Nyström and spectral shifting give the same errors on diffuse and random-walk inputs.
    rows = [_row(m, b, 1 / b, 0.0, seeds=1, regime=r) for r in ("diffuse", "random_walk")
            for m in ("nystrom", "spectral_shift") for b in (16, 64)]
    rows += [_row(m, None, e, 0.0, seeds=1, regime=r) for r in ("diffuse", "random_walk")
             for m, e in (("linear", 0.5), ("gated_linear", 0.5))]
    report.plot_error(rows, tmp_path / "e.png")
    styles = report.method_styles(["nystrom", "spectral_shift", "linear", "gated_linear"])
    for ax in figures[0].axes:
        lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}
        assert set(lines) == {"nystrom", "spectral_shift"}
        looks = {m: (x.get_marker(), x.get_linestyle(), x.get_color(), x.get_markerfacecolor())
                 for m, x in lines.items()}
        assert looks == {"nystrom": ("o", "-", "C0", "C0"),
                         "spectral_shift": ("s", "--", "C1", "none")}
        flat = {c.get_label(): c for c in ax.collections if not c.get_label().startswith("_")}
        assert set(flat) == {"linear", "gated_linear"}
        assert flat["linear"].get_linestyle() != flat["gated_linear"].get_linestyle()
        assert styles["linear"]["color"] != styles["gated_linear"]["color"]
    assert len({(s["marker"], s["linestyle"]) for s in report.method_styles(
        [f"m{i}" for i in range(44)]).values()}) == 44


def test_page_fault_note_is_self_contained():
    loud = {"method": "nystrom", "mode": "fwd_bwd", "length": 16384, "skipped": None,
            "minor_faults_per_call": 18070.4}
    [note] = report.speed_notes([loud])
    assert "README" not in note
    assert note.endswith(
        "18,070): their times include the kernel zero-filling scratch buffers that the "
        "allocator (glibc malloc) returned to the OS after the previous call, so they grow "
        "faster than the work; to time without it, preload a caching allocator, e.g. "
        "LD_PRELOAD=libjemalloc.so.2 or LD_PRELOAD=libtcmalloc.so.4 (Debian/Ubuntu packages "
        "libjemalloc2, libgoogle-perftools4)")
