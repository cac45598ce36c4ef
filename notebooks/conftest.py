"""nbval settings for the notebooks: figures are compared by their structure, never their numbers.

A figure's data is computed with floats whose low bits differ from one CPU to the next (SIMD width,
BLAS kernels, thread count), so the plotly JSON stored for JupyterLab cannot be compared bit for
bit, and rounding it would not help either: a value that sits near a rounding boundary still
flips. nbval therefore skips ``application/vnd.plotly.v1+json`` (as it skips widget views), and
``nbval_sanitize.cfg`` swaps each HTML snapshot for a placeholder. What it does compare is the
``text/plain`` summary every figure carries (``inferlab.viz.figure_summary``: title, axes, each
trace's kind, name and number of points); the notebooks' assert cells check the numbers, with
tolerances. `make test` runs nbval twice, the second time under settings that change float
rounding, to prove the stored outputs hold on another CPU.
"""
from __future__ import annotations

#: Output types nbval does not compare (beyond its own list): figure data, see above.
FIGURE_DATA = ("application/vnd.plotly.v1+json",)


def pytest_collectstart(collector):
    try:
        from nbval.plugin import IPyNbFile
    except ImportError:  # nbval not installed: nothing to configure
        return
    if isinstance(collector, IPyNbFile):
        collector.skip_compare = tuple(collector.skip_compare) + FIGURE_DATA
